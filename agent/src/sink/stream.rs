//! Data files that stay open while rows stream in.
//!
//! Rows are written as they arrive (a chunk at a time) into one open Parquet file per
//! partition of the table's default spec. The Parquet writer keeps one row group in
//! memory and flushes it to storage when it reaches `row_group_bytes` (a local file, or
//! a part of a multipart upload on S3); a file rolls at `target_file_size`. A commit
//! closes every open file ([`OpenFiles::close_all`]) and adds every file closed since
//! the last one. At most `max_open_files` files are open per table: past that the least
//! recently written partition's file is closed early (`floe_files_closed_early_total`).
//!
//! Every file of one [`OpenFiles`] has one schema: a commit that adds columns closes the
//! open files first and opens new ones in the wider schema (files of the older schema
//! stay valid: readers match columns by field id).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::spec::{DataFile, PartitionKey, PartitionSpec, Schema, Struct};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{CurrentFileStatus, IcebergWriter, IcebergWriterBuilder};
use iceberg::{Error, ErrorKind};
use indexmap::IndexMap;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use uuid::Uuid;

use super::writer::{CHUNK_ROWS, group_rows};

type FileWriter = iceberg::writer::base_writer::data_file_writer::DataFileWriter<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
>;

/// Where a written row is: its data file and position.
pub type RowPlace = (Arc<str>, u64);

/// Bounds of the open files of one table.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// A file rolls past this size.
    pub target_file_size: u64,
    /// A row group is flushed to storage past this size (or 128Ki rows).
    pub row_group_bytes: u64,
    /// Files open at once (one per partition written to).
    pub max_open_files: usize,
}

/// Rows per Parquet row group at most (the byte bound usually comes first).
const ROW_GROUP_ROWS: usize = 128 * 1024;

struct Open {
    writer: FileWriter,
    /// Bytes in files this writer already rolled past (closed inside the writer).
    rolled: u64,
    /// Whether anything was written (the writer opens its first file on the first write;
    /// it cannot say where it writes before).
    started: bool,
}

impl Open {
    fn written_size(&self) -> u64 {
        if self.started {
            self.rolled + self.writer.current_written_size() as u64
        } else {
            0
        }
    }
}

/// The open data files of one table, all in one schema.
pub struct OpenFiles {
    table: Table,
    schema: Arc<Schema>,
    arrow: SchemaRef,
    spec: PartitionSpec,
    limits: StreamLimits,
    prefix: String,
    location: DefaultLocationGenerator,
    /// Per partition (least recently written first).
    open: IndexMap<Struct, Open>,
    closed: Vec<DataFile>,
    /// Files closed because too many were open.
    pub closed_early: u64,
}

impl OpenFiles {
    /// Files of `table` (its default partition spec) in `schema`, named after `prefix`.
    pub fn new(
        table: &Table,
        schema: Arc<Schema>,
        prefix: &str,
        limits: StreamLimits,
    ) -> iceberg::Result<OpenFiles> {
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
        Ok(OpenFiles {
            table: table.clone(),
            spec: table.metadata().default_partition_spec().as_ref().clone(),
            schema,
            arrow,
            limits,
            prefix: format!("{prefix}-{}", Uuid::now_v7()),
            location: DefaultLocationGenerator::new(table.metadata())?,
            open: IndexMap::new(),
            closed: Vec::new(),
            closed_early: 0,
        })
    }

    /// The schema every file here is written in.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// Its Arrow form (with field ids): what [`OpenFiles::write`] takes.
    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.arrow
    }

    /// The id of the partition spec the files are written in.
    pub fn spec_id(&self) -> i32 {
        self.spec.spec_id()
    }

    /// Bytes written so far: closed files, and open ones as far as they are encoded.
    pub fn bytes(&self) -> u64 {
        let closed: u64 = self.closed.iter().map(DataFile::file_size_in_bytes).sum();
        let open: u64 = self.open.values().map(Open::written_size).sum();
        closed + open
    }

    /// Whether no file is open or closed.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.closed.is_empty()
    }

    /// Writes `batch` (in [`OpenFiles::arrow_schema`]). With `places`, also returns
    /// where each row went, in input order.
    pub async fn write(
        &mut self,
        batch: RecordBatch,
        places: Option<&mut Vec<RowPlace>>,
    ) -> iceberg::Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.spec.is_unpartitioned() {
            let written = self.write_partition(Struct::empty(), batch).await?;
            if let Some(places) = places {
                places.extend(written);
            }
            return Ok(());
        }
        let batches = [batch];
        let groups = group_rows(&self.spec, &self.schema, &batches)?;
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        let mut out: Vec<Option<RowPlace>> = match &places {
            Some(_) => vec![None; batches[0].num_rows()],
            None => Vec::new(),
        };
        for (partition, rows) in groups {
            for chunk in rows.chunks(CHUNK_ROWS) {
                let part = arrow_select::interleave::interleave_record_batch(&refs, chunk)
                    .map_err(|e| Error::new(ErrorKind::Unexpected, format!("gather rows: {e}")))?;
                let written = self.write_partition(partition.clone(), part).await?;
                if places.is_some() {
                    for ((_, row), place) in chunk.iter().zip(written) {
                        out[*row] = Some(place);
                    }
                }
            }
        }
        if let Some(places) = places {
            places.extend(out.into_iter().map(|p| p.expect("every row placed")));
        }
        Ok(())
    }

    /// Writes rows of one partition into its open file (opening it, and closing the
    /// least recently written one past `max_open_files`); returns their places.
    async fn write_partition(
        &mut self,
        partition: Struct,
        batch: RecordBatch,
    ) -> iceberg::Result<Vec<RowPlace>> {
        let n = batch.num_rows();
        if !self.open.contains_key(&partition) {
            if self.open.len() >= self.limits.max_open_files.max(1) {
                let (_, lru) = self.open.shift_remove_index(0).expect("an open file");
                self.close_one(lru).await?;
                self.closed_early += 1;
            }
            let writer = self.open_writer(partition.clone()).await?;
            self.open.insert(
                partition.clone(),
                Open {
                    writer,
                    rolled: 0,
                    started: false,
                },
            );
        }
        // Most recently written last.
        let index = self.open.get_index_of(&partition).expect("open");
        let last = self.open.len() - 1;
        self.open.move_index(index, last);
        let open = &mut self.open[last];
        let before = open.started.then(|| {
            (
                open.writer.current_written_size() as u64,
                open.writer.current_file_path(),
            )
        });
        open.writer.write(batch).await?;
        open.started = true;
        let path: Arc<str> = Arc::from(open.writer.current_file_path());
        if let Some((size, before_path)) = before
            && *path != *before_path
        {
            // Rolled to a new file before this batch.
            open.rolled += size;
        }
        let end = open.writer.current_row_num() as u64;
        let start = end - n as u64;
        Ok((start..end).map(|pos| (path.clone(), pos)).collect())
    }

    async fn open_writer(&self, partition: Struct) -> iceberg::Result<FileWriter> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid zstd level"),
            ))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(self.limits.row_group_bytes as usize))
            .build();
        let names = DefaultFileNameGenerator::new(
            format!("{}-{}", self.prefix, Uuid::now_v7().simple()),
            None,
            iceberg::spec::DataFileFormat::Parquet,
        );
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, self.schema.clone()),
            self.limits.target_file_size as usize,
            self.table.file_io().clone(),
            self.location.clone(),
            names,
        );
        let key = PartitionKey::new(self.spec.clone(), self.schema.clone(), partition);
        DataFileWriterBuilder::new(rolling).build(Some(key)).await
    }

    async fn close_one(&mut self, mut open: Open) -> iceberg::Result<()> {
        self.closed.extend(open.writer.close().await?);
        Ok(())
    }

    /// Closes every open file.
    pub async fn close_all(&mut self) -> iceberg::Result<()> {
        while let Some((_, open)) = self.open.shift_remove_index(0) {
            self.close_one(open).await?;
        }
        Ok(())
    }

    /// The files closed so far, handed over (they belong to the next commit).
    pub fn take_closed(&mut self) -> Vec<DataFile> {
        std::mem::take(&mut self.closed)
    }
}
