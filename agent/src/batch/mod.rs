//! Batch stage: buffered records -> Arrow record batches in the table's schema.
//!
//! Payloads stay as the original JSON bytes until here and are decoded straight into
//! Arrow by arrow-json against the table schema (with Iceberg field ids), so there is
//! no intermediate row representation. The `_kafka_*` columns are built alongside.
//! Uuid columns are read as their canonical text and converted to 16 bytes after
//! (Arrow's JSON reader only reads hex into fixed-size binary).

mod uuid_columns;

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Schema as ArrowSchema, SchemaRef};
use iceberg::spec::Schema;

use crate::schema::RESERVED_COLUMNS;
use crate::source::KafkaRecord;

/// Rows per Arrow batch.
pub const BATCH_ROWS: usize = 8192;

/// Errors of the batch stage.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The table schema has no Arrow equivalent.
    #[error("cannot convert table schema to Arrow: {0}")]
    Schema(#[from] iceberg::Error),
    /// arrow-json rejected a payload the schema stage accepted (a bug: please report).
    #[error("cannot encode records as Arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

/// Turns buffered records into Arrow batches of one table schema.
pub struct BatchEncoder {
    schema: SchemaRef,
    payload_schema: SchemaRef,
    /// `payload_schema` with uuid columns as strings, when there are any.
    read_schema: Option<SchemaRef>,
}

impl BatchEncoder {
    /// An encoder for the given table schema.
    pub fn new(table_schema: &Schema) -> Result<BatchEncoder, BatchError> {
        let schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(table_schema)?);
        let payload_fields: Vec<_> = schema
            .fields()
            .iter()
            .filter(|f| !RESERVED_COLUMNS.contains(&f.name().as_str()))
            .cloned()
            .collect();
        let payload_schema = Arc::new(ArrowSchema::new(payload_fields));
        let read_schema = uuid_columns::read_schema(table_schema, &payload_schema);
        Ok(BatchEncoder {
            schema,
            payload_schema,
            read_schema,
        })
    }

    /// The full Arrow schema, `_kafka_*` columns included.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Encodes records (at most [`BATCH_ROWS`] at a time) into one batch.
    /// A record with no value (a tombstone) becomes a row whose payload columns are null.
    pub fn encode(&self, records: &[KafkaRecord]) -> Result<RecordBatch, BatchError> {
        let rows: Vec<&KafkaRecord> = records.iter().collect();
        self.encode_rows(&rows, None)
    }

    /// Like [`Self::encode`], for borrowed records, with the `_op` column's values
    /// (upsert tables; null when `ops` is `None`).
    pub fn encode_rows(
        &self,
        records: &[&KafkaRecord],
        ops: Option<&[&str]>,
    ) -> Result<RecordBatch, BatchError> {
        let read_schema = self.read_schema.as_ref().unwrap_or(&self.payload_schema);
        let mut decoder = arrow_json::ReaderBuilder::new(read_schema.clone())
            .with_batch_size(records.len().max(1))
            .build_decoder()?;
        for r in records {
            let bytes: &[u8] = r.value.as_deref().unwrap_or(b"{}");
            let mut rest = bytes;
            while !rest.is_empty() {
                let n = decoder.decode(rest)?;
                if n == 0 {
                    break;
                }
                rest = &rest[n..];
            }
            // A separator guarantees one value per record even for odd inputs like `1{}`.
            decoder.decode(b"\n")?;
        }
        let payload = match decoder.flush()? {
            Some(b) if self.read_schema.is_some() => {
                uuid_columns::convert(b, &self.payload_schema)?
            }
            Some(b) => b,
            None => RecordBatch::new_empty(self.payload_schema.clone()),
        };
        if payload.num_rows() != records.len() {
            return Err(BatchError::Arrow(arrow_schema::ArrowError::JsonError(
                format!(
                    "decoded {} rows from {} records",
                    payload.num_rows(),
                    records.len()
                ),
            )));
        }

        let mut partition = Int32Builder::with_capacity(records.len());
        let mut offset = Int64Builder::with_capacity(records.len());
        let mut timestamp = TimestampMicrosecondBuilder::with_capacity(records.len());
        let mut key = StringBuilder::with_capacity(records.len(), records.len() * 16);
        let mut op = StringBuilder::with_capacity(records.len(), records.len() * 6);
        for (i, r) in records.iter().enumerate() {
            op.append_option(ops.map(|o| o[i]));
            partition.append_value(r.partition);
            offset.append_value(r.offset);
            timestamp.append_option(r.timestamp_ms.map(|ms| ms * 1000));
            // Keys were checked to be UTF-8 before buffering.
            key.append_option(
                r.key
                    .as_deref()
                    .map(|k| std::str::from_utf8(k).unwrap_or_default()),
            );
        }
        // In RESERVED_COLUMNS order.
        let mut meta: [Option<ArrayRef>; 5] = [
            Some(Arc::new(partition.finish())),
            Some(Arc::new(offset.finish())),
            Some(Arc::new(timestamp.finish().with_timezone("+00:00"))),
            Some(Arc::new(key.finish())),
            Some(Arc::new(op.finish())),
        ];
        let mut payload_columns = payload.columns().iter();
        let columns = self
            .schema
            .fields()
            .iter()
            .map(
                |f| match RESERVED_COLUMNS.iter().position(|c| c == f.name()) {
                    Some(i) => meta[i].take().expect("each metadata column once"),
                    None => payload_columns.next().expect("payload column").clone(),
                },
            )
            .collect();
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};

    use super::*;
    use crate::schema::SchemaTracker;

    fn rec(offset: i64, value: Option<&str>) -> KafkaRecord {
        KafkaRecord {
            topic: Arc::from("t"),
            partition: 1,
            offset,
            timestamp_ms: Some(1_700_000_000_000),
            key: Some(b"k1".to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    #[test]
    fn encodes_payload_and_metadata_columns() {
        let values = [
            r#"{"id": 1, "amount": 2, "at": "2024-01-02T03:04:05.123456Z", "tags": ["a"], "user": {"name": "x"}}"#,
            r#"{"id": 2, "amount": 2.5}"#,
        ];
        let mut tracker = SchemaTracker::new();
        for v in values {
            tracker
                .observe(&crate::decode::decode_json(v.as_bytes()).unwrap())
                .unwrap();
        }
        let schema = tracker.new_table_schema().unwrap();
        let enc = BatchEncoder::new(&schema).unwrap();
        let records = vec![
            rec(10, Some(values[0])),
            rec(11, Some(values[1])),
            rec(12, None),
        ];
        let batch = enc.encode(&records).unwrap();
        assert_eq!(batch.num_rows(), 3);
        let col = |n: &str| batch.column_by_name(n).unwrap().clone();
        assert_eq!(
            col("_kafka_offset").as_primitive::<Int64Type>().values(),
            &[10, 11, 12]
        );
        assert_eq!(col("id").as_primitive::<Int64Type>().value(1), 2);
        assert!(col("id").is_null(2), "tombstone row has null payload");
        assert_eq!(col("amount").as_primitive::<Float64Type>().value(0), 2.0);
        assert_eq!(
            col("at")
                .as_primitive::<TimestampMicrosecondType>()
                .value(0),
            1_704_164_645_123_456
        );
        assert_eq!(
            col("_kafka_timestamp")
                .as_primitive::<TimestampMicrosecondType>()
                .value(0),
            1_700_000_000_000_000
        );
        assert_eq!(col("_kafka_key").as_string::<i32>().value(0), "k1");
        assert_eq!(
            col("user")
                .as_struct()
                .column(0)
                .as_string::<i32>()
                .value(0),
            "x"
        );
        let field = batch.schema().field_with_name("id").unwrap().clone();
        assert!(
            field.metadata().contains_key("PARQUET:field_id"),
            "field ids travel with the schema"
        );
    }
}
