//! Batch stage: admitted rows -> Arrow record batches, as they arrive.
//!
//! A [`RowBuffer`] per table appends every admitted row straight into Arrow column
//! builders (walking the parsed JSON once more, no second parse). When a column appears
//! or changes type the builders so far are sealed into a batch and new ones start; when
//! the buffer is committed, [`conform`] brings every batch to the table schema of that
//! commit (field ids, columns added later, widened types).
//!
//! The `_kafka_*` columns are built alongside; the upsert key of each row and its
//! topic-partition are kept next to the rows.

mod builder;
mod conform;

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, StringArray};
use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
use iceberg::spec::{NestedField, Schema, StructType};

pub use builder::UTC;
pub use conform::conform;

use self::builder::StructCol;
use crate::record::columns;
use crate::record::json::Obj;
use crate::record::key::KeyHash;
use crate::record::values::millis_to_micros;
use crate::record::{Header, PartitionMap, TopicPartition};
use crate::schema::SchemaTracker;

/// Rows per Arrow batch when writing.
pub const BATCH_ROWS: usize = 8192;

/// Memory a buffered row costs beyond its value and key bytes (metadata columns,
/// offsets, bookkeeping), counted against `flush_bytes`.
pub const ROW_OVERHEAD: u64 = 48;

/// Errors of the batch stage.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The table schema has no Arrow equivalent.
    #[error("cannot convert table schema to Arrow: {0}")]
    Schema(#[from] iceberg::Error),
    /// Arrow refused the data.
    #[error("cannot build Arrow batches: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A value the schema stage admitted does not encode (a bug: please report).
    #[error("internal error: an admitted value does not encode ({0}); please report this")]
    Mismatch(String),
}

/// Kafka metadata of one row.
#[derive(Debug, Clone, Copy)]
pub struct RowMeta<'a> {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Message timestamp (ms since the epoch).
    pub timestamp_ms: Option<i64>,
    /// The text stored in `_kafka_key`.
    pub key: Option<&'a str>,
    /// Record headers (stored in `_kafka_headers` when the table has it).
    pub headers: &'a [Header],
}

/// Rows buffered for one table.
pub struct RowBuffer {
    /// The tracker version the builders were made for (`None`: no builders yet).
    version: Option<u64>,
    schema: SchemaRef,
    payload: StructCol,
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    key: StringBuilder,
    /// Headers of the active rows, when the buffer schema has `_kafka_headers`.
    headers: Option<Vec<Vec<Header>>>,
    active_rows: usize,
    sealed: Vec<RecordBatch>,
    /// Per row: index into `tps`.
    row_tps: Vec<u32>,
    tps: Vec<TopicPartition>,
    tp_index: PartitionMap<u32>,
    /// Per entry of `tps`: the lowest offset of its rows (`i64::MAX`: none left).
    firsts: Vec<i64>,
    /// Per entry of `tps`: the highest offset of its rows.
    lasts: Vec<i64>,
    keys: Vec<(KeyHash, bool)>,
    bytes: u64,
}

/// What a buffer holds when it is handed to the committer.
#[derive(Debug, Default)]
pub struct Buffered {
    /// Batches in the buffer's own columns (see [`conform`]).
    pub batches: Vec<RecordBatch>,
    /// Upsert mode: the key of each row and whether the row is live (false for a
    /// tombstone), in row order.
    pub keys: Vec<(KeyHash, bool)>,
    /// Rows.
    pub rows: usize,
    /// Bytes counted against `flush_bytes`.
    pub bytes: u64,
    /// Per partition with rows: the lowest and the highest offset among them (the
    /// committer checks that neither the table nor its uncommitted files hold these
    /// records already).
    pub offsets: PartitionMap<(i64, i64)>,
}

impl Default for RowBuffer {
    fn default() -> Self {
        RowBuffer::new()
    }
}

impl RowBuffer {
    /// An empty buffer.
    pub fn new() -> RowBuffer {
        RowBuffer {
            version: None,
            schema: Arc::new(ArrowSchema::empty()),
            payload: StructCol::new(std::iter::empty(), Default::default()),
            partition: Int32Builder::new(),
            offset: Int64Builder::new(),
            timestamp: TimestampMicrosecondBuilder::new(),
            key: StringBuilder::new(),
            headers: None,
            active_rows: 0,
            sealed: Vec::new(),
            row_tps: Vec::new(),
            tps: Vec::new(),
            tp_index: PartitionMap::default(),
            firsts: Vec::new(),
            lasts: Vec::new(),
            keys: Vec::new(),
            bytes: 0,
        }
    }

    /// Rows buffered.
    pub fn rows(&self) -> usize {
        self.row_tps.len()
    }

    /// Bytes counted against `flush_bytes`.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.row_tps.is_empty()
    }

    /// Appends one admitted row (`value` `None`: a tombstone, payload columns null) and,
    /// in upsert mode, its key. `cost` is what the row counts against `flush_bytes`.
    pub fn append(
        &mut self,
        tracker: &SchemaTracker,
        tp: &TopicPartition,
        meta: RowMeta<'_>,
        value: Option<Obj<'_>>,
        key: Option<KeyHash>,
        cost: u64,
    ) -> Result<(), BatchError> {
        if self.version != Some(tracker.version()) {
            self.rebuild(tracker)?;
        }
        match value {
            Some(o) => self
                .payload
                .append(o)
                .map_err(|m| BatchError::Mismatch(m.0))?,
            None => self.payload.append_null(),
        }
        self.partition.append_value(meta.partition);
        self.offset.append_value(meta.offset);
        self.timestamp
            .append_option(meta.timestamp_ms.and_then(millis_to_micros));
        self.key.append_option(meta.key);
        if let Some(headers) = &mut self.headers {
            headers.push(meta.headers.to_vec());
        }
        self.active_rows += 1;
        let index = match self.tp_index.get(tp) {
            Some(&i) => {
                let first = &mut self.firsts[i as usize];
                *first = (*first).min(meta.offset);
                let last = &mut self.lasts[i as usize];
                *last = (*last).max(meta.offset);
                i
            }
            None => {
                let i = self.tps.len() as u32;
                self.tps.push(tp.clone());
                self.tp_index.insert(tp.clone(), i);
                self.firsts.push(meta.offset);
                self.lasts.push(meta.offset);
                i
            }
        };
        self.row_tps.push(index);
        let live = value.is_some();
        self.keys.extend(key.map(|k| (k, live)));
        self.bytes += cost;
        Ok(())
    }

    /// New builders for the tracker's current columns; rows so far become a batch.
    fn rebuild(&mut self, tracker: &SchemaTracker) -> Result<(), BatchError> {
        self.seal()?;
        let payload = tracker.buffer_type();
        let (topic, headers) = (
            tracker.options().topic_column,
            tracker.options().headers_column,
        );
        self.schema = buffer_schema(&payload, topic, headers)?;
        self.headers = headers.then(Vec::new);
        let kafka_columns = 4 + usize::from(topic) + usize::from(headers);
        let fields = self
            .schema
            .fields()
            .iter()
            .skip(kafka_columns)
            .cloned()
            .collect();
        self.payload = StructCol::new(payload.fields().iter().map(|f| &*f.field_type), fields);
        self.version = Some(tracker.version());
        Ok(())
    }

    /// Finishes the active builders into a batch.
    fn seal(&mut self) -> Result<(), BatchError> {
        if self.active_rows == 0 {
            return Ok(());
        }
        let rows = self.active_rows;
        self.active_rows = 0;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish().with_timezone(UTC)),
            Arc::new(self.key.finish()),
        ];
        if self.schema.column_with_name(columns::TOPIC).is_some() {
            // The topic of each row, from the partition it was read from.
            let tps = &self.row_tps[self.row_tps.len() - rows..];
            let topics: StringArray = tps
                .iter()
                .map(|&i| Some(&*self.tps[i as usize].0))
                .collect();
            columns.push(Arc::new(topics));
        }
        if let Some(headers) = &mut self.headers {
            let (_, field) = self
                .schema
                .column_with_name(columns::HEADERS)
                .expect("a buffer with headers has the column");
            columns.push(headers_array(field.data_type(), std::mem::take(headers))?);
        }
        columns.extend(self.payload.finish_columns());
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        self.sealed.push(batch);
        Ok(())
    }

    /// Takes everything buffered; the buffer is empty afterwards (builders are kept).
    pub fn take(&mut self) -> Result<Buffered, BatchError> {
        self.seal()?;
        let rows = self.row_tps.len();
        let offsets = self
            .tps
            .drain(..)
            .zip(self.firsts.drain(..).zip(self.lasts.drain(..)))
            .filter(|(_, (first, _))| *first != i64::MAX)
            .collect();
        self.row_tps.clear();
        self.tp_index.clear();
        Ok(Buffered {
            batches: std::mem::take(&mut self.sealed),
            keys: std::mem::take(&mut self.keys),
            rows,
            bytes: std::mem::replace(&mut self.bytes, 0),
            offsets,
        })
    }

    /// Drops the rows of the partitions `keep` says no to (revoked partitions), keeping
    /// the others in order.
    pub fn retain(&mut self, keep: impl Fn(&TopicPartition) -> bool) -> Result<(), BatchError> {
        let keep_tp: Vec<bool> = self.tps.iter().map(&keep).collect();
        if keep_tp.iter().all(|k| *k) {
            return Ok(());
        }
        for (first, kept) in self.firsts.iter_mut().zip(&keep_tp) {
            if !kept {
                *first = i64::MAX;
            }
        }
        self.seal()?;
        let mask: Vec<bool> = self.row_tps.iter().map(|&i| keep_tp[i as usize]).collect();
        let total = mask.len().max(1) as u64;
        let kept_rows = mask.iter().filter(|k| **k).count() as u64;
        let mut at = 0;
        let mut batches = Vec::with_capacity(self.sealed.len());
        for batch in self.sealed.drain(..) {
            let n = batch.num_rows();
            let filter = BooleanArray::from(mask[at..at + n].to_vec());
            at += n;
            let kept = arrow_select::filter::filter_record_batch(&batch, &filter)?;
            if kept.num_rows() > 0 {
                batches.push(kept);
            }
        }
        self.sealed = batches;
        if !self.keys.is_empty() {
            let keys = std::mem::take(&mut self.keys);
            self.keys = keys
                .into_iter()
                .zip(&mask)
                .filter_map(|(k, m)| m.then_some(k))
                .collect();
        }
        self.row_tps = self
            .row_tps
            .iter()
            .zip(&mask)
            .filter_map(|(i, m)| m.then_some(*i))
            .collect();
        self.bytes = self.bytes * kept_rows / total;
        Ok(())
    }
}

/// The Arrow schema rows are buffered in: the `_kafka_*` columns, then the payload.
fn buffer_schema(
    payload: &StructType,
    topic: bool,
    headers: bool,
) -> Result<SchemaRef, BatchError> {
    let mut next = 0;
    let mut id = || {
        next += 1;
        next
    };
    let mut fields = columns::kafka_fields(&mut id, topic, headers);
    for f in payload.fields() {
        fields.push(Arc::new(NestedField::optional(
            id(),
            f.name.clone(),
            crate::schema::renumber(&f.field_type, &mut id),
        )));
    }
    let schema = Schema::builder().with_fields(fields).build()?;
    Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?))
}

/// The `_kafka_headers` column of `rows` (one header list per row; an empty list is an
/// empty map) with exactly the map type of the buffer schema. A name that repeats keeps
/// its last value: map keys are unique.
fn headers_array(
    map_type: &arrow_schema::DataType,
    rows: Vec<Vec<Header>>,
) -> Result<ArrayRef, BatchError> {
    use arrow_array::builder::BinaryBuilder;
    let arrow_schema::DataType::Map(entries, sorted) = map_type else {
        return Err(BatchError::Mismatch(format!(
            "_kafka_headers is {map_type}, not a map"
        )));
    };
    let arrow_schema::DataType::Struct(kv) = entries.data_type() else {
        return Err(BatchError::Mismatch("map entries are not a struct".into()));
    };
    let mut keys = StringBuilder::new();
    let mut values = BinaryBuilder::new();
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    offsets.push(0i32);
    for row in rows {
        let mut last: Vec<Header> = Vec::with_capacity(row.len());
        for (name, value) in row {
            match last.iter_mut().find(|(n, _)| *n == name) {
                Some(entry) => entry.1 = value,
                None => last.push((name, value)),
            }
        }
        for (name, value) in &last {
            keys.append_value(name);
            values.append_option(value.as_deref());
        }
        let end = offsets.last().copied().unwrap_or(0) + last.len() as i32;
        offsets.push(end);
    }
    // Iceberg's Arrow types may be the large variants: cast to exactly those.
    let keys = arrow_cast::cast(&keys.finish(), kv[0].data_type())?;
    let values = arrow_cast::cast(&values.finish(), kv[1].data_type())?;
    let entries_array = arrow_array::StructArray::try_new(kv.clone(), vec![keys, values], None)?;
    Ok(Arc::new(arrow_array::MapArray::try_new(
        entries.clone(),
        arrow_buffer::OffsetBuffer::new(offsets.into()),
        entries_array,
        None,
        *sorted,
    )?))
}

/// The Arrow schema a table version is written with (field ids in the metadata).
pub fn table_arrow_schema(schema: &Schema) -> Result<SchemaRef, BatchError> {
    Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(schema)?))
}

/// A field of an Arrow schema by name (for callers that fill computed columns).
pub fn arrow_field(schema: &SchemaRef, name: &str) -> Option<Field> {
    schema.field_with_name(name).ok().cloned()
}

#[cfg(test)]
pub(crate) mod tests;
