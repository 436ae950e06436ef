//! Position-delete files: Parquet files of `(file_path, pos)` rows, sorted, as the Iceberg
//! spec defines them.
// upstream: position-delete writer (iceberg-rust 0.10 has no writer for position-delete
// files, and its readers are not public; delete when it has both)

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use foldhash::fast::RandomState;
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, Struct};
use iceberg::table::Table;
use parquet::arrow::ArrowWriter;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::Error;

/// Reserved field id of `file_path` in position-delete files (Iceberg spec).
const FILE_PATH_ID: i32 = 2_147_483_546;
/// Reserved field id of `pos` in position-delete files (Iceberg spec).
const POS_ID: i32 = 2_147_483_545;

/// Writes one position-delete file for `rows` (any order) into the table's data folder.
/// The rows' data files all belong to partition `partition` of spec `spec_id`, which the
/// delete file takes (readers match position deletes to data files by partition).
pub async fn write_position_deletes(
    table: &Table,
    name_prefix: &str,
    spec_id: i32,
    partition: Struct,
    mut rows: Vec<(String, u64)>,
) -> Result<DataFile, Error> {
    rows.sort_unstable();
    rows.dedup();
    let field = |name: &str, t: DataType, id: i32| {
        Field::new(name, t, false).with_metadata(HashMap::from([(
            "PARQUET:field_id".to_string(),
            id.to_string(),
        )]))
    };
    let schema = Arc::new(Schema::new(vec![
        field("file_path", DataType::Utf8, FILE_PATH_ID),
        field("pos", DataType::Int64, POS_ID),
    ]));
    let files: ArrayRef = Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0)));
    let positions: ArrayRef = Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.1 as i64),
    ));
    let batch = RecordBatch::try_new(schema.clone(), vec![files, positions])?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(props))?;
    writer.write(&batch)?;
    let bytes = Bytes::from(writer.into_inner()?);

    let path = format!(
        "{}/data/{name_prefix}-{}-deletes.parquet",
        table.metadata().location(),
        uuid::Uuid::now_v7()
    );
    let size = bytes.len() as u64;
    table.file_io().new_output(&path)?.write(bytes).await?;

    // Bounds on file_path let readers skip this file for data files it cannot touch.
    let (first, last) = (&rows[0].0, &rows[rows.len() - 1].0);
    let mut builder = DataFileBuilder::default();
    builder
        .content(DataContentType::PositionDeletes)
        .file_path(path)
        .file_format(DataFileFormat::Parquet)
        .record_count(rows.len() as u64)
        .file_size_in_bytes(size)
        .partition(partition)
        .partition_spec_id(spec_id)
        .lower_bounds(HashMap::from([(FILE_PATH_ID, Datum::string(first))]))
        .upper_bounds(HashMap::from([(FILE_PATH_ID, Datum::string(last))]));
    if first == last {
        builder.referenced_data_file(Some(first.clone()));
    }
    builder
        .build()
        .map_err(|e| Error::Unsupported(format!("position-delete file metadata: {e}")))
}

/// Adds the (file, position) pairs of a position-delete file to `deleted`, reading it a
/// batch at a time.
pub async fn read_position_deletes(
    table: &Table,
    path: &str,
    deleted: &mut HashMap<String, Vec<u64>, RandomState>,
) -> Result<(), Error> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use futures::StreamExt;

    let input = table.file_io().new_input(path)?;
    let meta = input.metadata().await?;
    let reader = iceberg::arrow::ArrowFileReader::new(meta, input.reader().await?);
    let mut stream = ParquetRecordBatchStreamBuilder::new(reader)
        .await?
        .with_batch_size(64 * 1024)
        .build()?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let (Some(files), Some(positions)) = (
            batch.column_by_name("file_path"),
            batch.column_by_name("pos"),
        ) else {
            return Err(Error::Unsupported(format!(
                "position-delete file {path} lacks file_path/pos"
            )));
        };
        let files = arrow_cast::cast(files, &arrow_schema::DataType::Utf8)?;
        let files = files.as_string::<i32>();
        let positions = positions.as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            deleted
                .entry(files.value(row).to_string())
                .or_default()
                .push(positions.value(row) as u64);
        }
    }
    Ok(())
}
