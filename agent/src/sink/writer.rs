//! Parquet data files from Arrow batches, rolled at the target file size, one partition
//! at a time.
//!
//! Fan-out with a bound: the rows of one commit are grouped by the partition the
//! table's default spec gives them (computed with iceberg-rust's transforms), then each
//! partition is written by its own rolling writer, which is closed before the next one
//! opens. So one file is open at a time whatever the number of partitions, and a
//! commit writes one file per partition it touches (more only past the target size).
//! The grouping holds row indices, not copies; rows are copied once, a chunk at a time,
//! into the writer.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::spec::{
    DataFile, DataFileFormat, Literal, PartitionKey, PartitionSpec, Schema, Struct,
};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Error, ErrorKind};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use uuid::Uuid;

/// Rows copied into the writer at a time.
pub(crate) const CHUNK_ROWS: usize = 8192;

/// Rows per Parquet row group: the writer holds one encoded row group in memory.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;

/// The largest row group of a file rolled at `target` bytes.
///
/// The rolling writer measures a file as its flushed (compressed) bytes plus the
/// in-memory estimate of the open row group, which is several times its compressed
/// size. With row groups of at most an eighth of the target, a file is rolled only
/// once more than 7/8 of the target is on disk, so a file rolled at the target is
/// never below compaction's "small" mark (3/4) and compaction converges.
fn row_group_bytes(target: u64) -> usize {
    (target / 8).clamp(16 * 1024, 32 << 20) as usize
}

/// What [`write_data_files`] wrote.
#[derive(Debug, Default)]
pub struct Written {
    /// The data files, in the table's default partition spec.
    pub files: Vec<DataFile>,
    /// The id of that spec.
    pub spec_id: i32,
    /// Row order across `files` (file after file, position after position) as indices
    /// into the input rows (batches concatenated); `None` when the input order is kept
    /// (an unpartitioned table).
    pub order: Option<Vec<u32>>,
}

/// Writes `batches` (already in `schema`'s Arrow form) as Parquet data files of `table`
/// in its default partition spec, named after `prefix`.
pub async fn write_data_files(
    table: &Table,
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
    prefix: &str,
    target_file_size: u64,
) -> iceberg::Result<Written> {
    let spec = table.metadata().default_partition_spec().as_ref().clone();
    write_in_spec(table, schema, spec, batches, prefix, target_file_size).await
}

/// [`write_data_files`] with an explicit partition spec of the table.
pub async fn write_in_spec(
    table: &Table,
    schema: Arc<Schema>,
    spec: PartitionSpec,
    batches: Vec<RecordBatch>,
    prefix: &str,
    target_file_size: u64,
) -> iceberg::Result<Written> {
    let spec_id = spec.spec_id();
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Written {
            spec_id,
            ..Written::default()
        });
    }
    let files = FileFactory::new(table, schema.clone(), prefix, target_file_size)?;
    if spec.is_unpartitioned() {
        let key = PartitionKey::new(spec, schema, Struct::empty());
        let files = files.write(key, batches.into_iter()).await?;
        return Ok(Written {
            files,
            spec_id,
            order: None,
        });
    }
    let groups = group_rows(&spec, &schema, &batches)?;
    let mut out = Vec::new();
    let mut order = Vec::with_capacity(batches.iter().map(|b| b.num_rows()).sum());
    let offsets: Vec<u32> = batches
        .iter()
        .scan(0u32, |at, b| {
            let start = *at;
            *at += b.num_rows() as u32;
            Some(start)
        })
        .collect();
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    for (partition, rows) in groups {
        let key = PartitionKey::new(spec.clone(), schema.clone(), partition);
        order.extend(rows.iter().map(|(b, r)| offsets[*b] + *r as u32));
        let chunks = rows.chunks(CHUNK_ROWS).map(|chunk| {
            arrow_select::interleave::interleave_record_batch(&refs, chunk)
                .map_err(|e| Error::new(ErrorKind::Unexpected, format!("gather rows: {e}")))
        });
        let chunks: Vec<RecordBatch> = chunks.collect::<iceberg::Result<_>>()?;
        out.extend(files.write(key, chunks.into_iter()).await?);
    }
    Ok(Written {
        files: out,
        spec_id,
        order: Some(order),
    })
}

/// Rows of `batches` grouped by partition, partitions in order of first appearance, rows
/// in input order: `(batch index, row index)`.
pub(crate) type Groups = Vec<(Struct, Vec<(usize, usize)>)>;

pub(crate) fn group_rows(
    spec: &PartitionSpec,
    schema: &Schema,
    batches: &[RecordBatch],
) -> iceberg::Result<Groups> {
    let calculator = PartitionValueCalculator::try_new(spec, schema)?;
    let mut index: HashMap<Struct, usize> = HashMap::new();
    let mut groups: Groups = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        if batch.num_rows() == 0 {
            continue;
        }
        let values = calculator.calculate(batch)?;
        let literals = arrow_struct_to_literal(&values, calculator.partition_type())?;
        for (r, literal) in literals.into_iter().enumerate() {
            let Some(Literal::Struct(partition)) = literal else {
                return Err(Error::new(
                    ErrorKind::DataInvalid,
                    "a partition value is not a struct",
                ));
            };
            let g = match index.get(&partition) {
                Some(g) => *g,
                None => {
                    index.insert(partition.clone(), groups.len());
                    groups.push((partition, Vec::new()));
                    groups.len() - 1
                }
            };
            groups[g].1.push((b, r));
        }
    }
    Ok(groups)
}

/// Opens rolling writers for one partition at a time.
struct FileFactory {
    table: Table,
    schema: Arc<Schema>,
    prefix: String,
    target: u64,
    location: DefaultLocationGenerator,
}

impl FileFactory {
    fn new(table: &Table, schema: Arc<Schema>, prefix: &str, target: u64) -> iceberg::Result<Self> {
        Ok(FileFactory {
            table: table.clone(),
            schema,
            prefix: format!("{prefix}-{}", Uuid::now_v7()),
            target,
            location: DefaultLocationGenerator::new(table.metadata())?,
        })
    }

    /// Writes `batches` into files of partition `key`; the writer is closed on return.
    async fn write(
        &self,
        key: PartitionKey,
        batches: impl Iterator<Item = RecordBatch>,
    ) -> iceberg::Result<Vec<DataFile>> {
        let mut writer = self.open(key).await?;
        for batch in batches {
            if batch.num_rows() > 0 {
                writer.write(batch).await?;
            }
        }
        writer.close().await
    }

    async fn open(&self, key: PartitionKey) -> iceberg::Result<FileWriter> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid zstd level"),
            ))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(row_group_bytes(self.target)))
            .build();
        // A name generator per partition: its counter makes names unique within it.
        let names = DefaultFileNameGenerator::new(
            format!("{}-{}", self.prefix, Uuid::now_v7().simple()),
            None,
            DataFileFormat::Parquet,
        );
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, self.schema.clone()),
            self.target as usize,
            self.table.file_io().clone(),
            self.location.clone(),
            names,
        );
        DataFileWriterBuilder::new(rolling).build(Some(key)).await
    }
}

type FileWriter = iceberg::writer::base_writer::data_file_writer::DataFileWriter<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
>;

/// Data files of one partition written as batches arrive, rolled at the target size
/// (compaction streams a partition's rows through one of these).
pub struct PartitionWriter {
    writer: FileWriter,
}

impl PartitionWriter {
    /// Opens a writer for `partition` of `spec`; batches must be in `schema`'s Arrow form.
    pub async fn open(
        table: &Table,
        schema: Arc<Schema>,
        spec: PartitionSpec,
        partition: Struct,
        prefix: &str,
        target_file_size: u64,
    ) -> iceberg::Result<PartitionWriter> {
        let factory = FileFactory::new(table, schema.clone(), prefix, target_file_size)?;
        let key = PartitionKey::new(spec, schema, partition);
        Ok(PartitionWriter {
            writer: factory.open(key).await?,
        })
    }

    /// Writes `batch` (rows stay in order across the files).
    pub async fn write(&mut self, batch: RecordBatch) -> iceberg::Result<()> {
        if batch.num_rows() > 0 {
            self.writer.write(batch).await?;
        }
        Ok(())
    }

    /// Closes the last file; returns the files in the order their rows were written.
    pub async fn close(mut self) -> iceberg::Result<Vec<DataFile>> {
        self.writer.close().await
    }
}
