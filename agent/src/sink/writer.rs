//! Parquet data files from Arrow batches, rolled at the target file size.

use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::{DataFile, DataFileFormat, Schema};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use uuid::Uuid;

/// Rows per Parquet row group.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Writes `batches` (already in `schema`'s Arrow form) as Parquet data files of `table`,
/// named after `prefix`. Rows keep their order across files.
pub async fn write_data_files(
    table: &Table,
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
    prefix: &str,
    target_file_size: u64,
) -> iceberg::Result<Vec<DataFile>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    // Row groups of at most 128k rows: the writer holds one encoded row group in memory.
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let location = DefaultLocationGenerator::new(table.metadata())?;
    let names = DefaultFileNameGenerator::new(
        format!("{prefix}-{}", Uuid::now_v7()),
        None,
        DataFileFormat::Parquet,
    );
    let rolling = RollingFileWriterBuilder::new(
        ParquetWriterBuilder::new(props, schema),
        target_file_size as usize,
        table.file_io().clone(),
        location,
        names,
    );
    let mut writer = DataFileWriterBuilder::new(rolling).build(None).await?;
    for batch in batches {
        if batch.num_rows() > 0 {
            writer.write(batch).await?;
        }
    }
    writer.close().await
}
