use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use iceberg::spec::Schema;
use serde_json::{Map, Value, json};

use super::*;
use crate::record::json::JsonObject;
use crate::schema::SchemaTracker;

fn tp() -> TopicPartition {
    (Arc::from("t"), 1)
}

/// Admits every record into `tracker` and buffers it; returns the buffered batches
/// conformed to `table` (the schema a commit would write with).
pub(crate) fn encode(
    tracker: &mut SchemaTracker,
    table: impl Fn(&SchemaTracker) -> Schema,
    records: &[Option<Map<String, Value>>],
) -> Result<RecordBatch, BatchError> {
    let mut buffer = RowBuffer::new();
    for (i, r) in records.iter().enumerate() {
        let object = r.as_ref().map(JsonObject::from_map);
        if let Some(o) = &object {
            tracker
                .observe_json(o.view().root(), None)
                .map_err(|e| BatchError::Mismatch(e.to_string()))?;
        }
        let meta = RowMeta {
            partition: 1,
            offset: i as i64,
            timestamp_ms: Some(1_700_000_000_000),
            key: Some("k1"),
            headers: &[],
        };
        buffer.append(
            tracker,
            &tp(),
            meta,
            object.as_ref().map(|o| o.view().root()),
            None,
            1,
        )?;
    }
    let arrow = table_arrow_schema(&table(tracker))?;
    let buffered = buffer.take()?;
    let batches = buffered
        .batches
        .iter()
        .map(|b| conform(b, &arrow))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(arrow_select::concat::concat_batches(&arrow, &batches)?)
}

fn obj(v: Value) -> Option<Map<String, Value>> {
    Some(v.as_object().unwrap().clone())
}

#[test]
fn encodes_payload_and_metadata_columns() {
    let mut tracker = SchemaTracker::new();
    let batch = encode(
        &mut tracker,
        |t| t.new_table_schema().unwrap(),
        &[
            obj(json!({"id": 1, "amount": 2, "at": "2024-01-02T03:04:05.123456Z", "tags": ["a"], "user": {"name": "x"}})),
            obj(json!({"id": 2, "amount": 2.5})),
            None,
        ],
    )
    .unwrap();
    assert_eq!(batch.num_rows(), 3);
    let col = |n: &str| batch.column_by_name(n).unwrap().clone();
    assert_eq!(
        col("_kafka_offset").as_primitive::<Int64Type>().values(),
        &[0, 1, 2]
    );
    assert_eq!(col("id").as_primitive::<Int64Type>().value(1), 2);
    assert!(col("id").is_null(2), "tombstone row has null payload");
    assert_eq!(
        col("amount").as_primitive::<Float64Type>().value(0),
        2.0,
        "a long column widened to double after the first row keeps its value"
    );
    assert_eq!(
        col("at")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_704_164_645_123_456,
        "a timestamp buffered as text is converted when written"
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

#[test]
fn rows_of_revoked_partitions_are_dropped_in_order() {
    let mut tracker = SchemaTracker::new();
    let mut buffer = RowBuffer::new();
    let a: TopicPartition = (Arc::from("t"), 0);
    let b: TopicPartition = (Arc::from("t"), 1);
    for i in 0..6 {
        let o = JsonObject::from_map(json!({"n": i}).as_object().unwrap());
        tracker.observe_json(o.view().root(), None).unwrap();
        let tp = if i % 2 == 0 { &a } else { &b };
        let meta = RowMeta {
            partition: tp.1,
            offset: i,
            timestamp_ms: None,
            key: None,
            headers: &[],
        };
        buffer
            .append(
                &tracker,
                tp,
                meta,
                Some(o.view().root()),
                Some(i as u128),
                10,
            )
            .unwrap();
    }
    buffer.retain(|tp| *tp != b).unwrap();
    assert_eq!(buffer.rows(), 3);
    let taken = buffer.take().unwrap();
    let offsets: Vec<i64> = taken
        .batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("_kafka_offset")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(offsets, [0, 2, 4]);
    assert_eq!(taken.keys, [(0, true), (2, true), (4, true)]);
    assert!(buffer.is_empty());
}

#[test]
fn kafka_timestamps_that_overflow_are_null_not_a_crash() {
    let tracker = SchemaTracker::new();
    let mut buffer = RowBuffer::new();
    let meta = RowMeta {
        partition: 0,
        offset: 0,
        timestamp_ms: Some(i64::MAX),
        key: None,
        headers: &[],
    };
    buffer.append(&tracker, &tp(), meta, None, None, 1).unwrap();
    let taken = buffer.take().unwrap();
    assert!(
        taken.batches[0]
            .column_by_name("_kafka_timestamp")
            .unwrap()
            .is_null(0)
    );
}

#[test]
fn lists_and_maps_are_rebuilt_with_their_children_conformed() {
    use arrow_array::ArrayRef;
    use arrow_array::builder::{Int32Builder, ListBuilder, MapBuilder, StringBuilder};
    use arrow_schema::{DataType, Field, Fields, Schema as ArrowSchema};

    let mut list = ListBuilder::new(Int32Builder::new());
    list.values().append_value(1);
    list.values().append_value(2);
    list.append(true);
    list.append(false);
    let mut map = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
    map.keys().append_value("a");
    map.values().append_value(7);
    map.append(true).unwrap();
    map.append(false).unwrap();
    let batch = RecordBatch::try_from_iter([
        ("l", Arc::new(list.finish()) as ArrayRef),
        ("m", Arc::new(map.finish()) as ArrayRef),
    ])
    .unwrap();

    // Ints widened to longs inside both, under the table's child names.
    let entries = Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Int64, true),
    ]);
    let target = Arc::new(ArrowSchema::new(vec![
        Field::new(
            "l",
            DataType::List(Arc::new(Field::new("element", DataType::Int64, true))),
            true,
        ),
        Field::new(
            "m",
            DataType::Map(
                Arc::new(Field::new("key_value", DataType::Struct(entries), false)),
                false,
            ),
            true,
        ),
    ]));
    let out = conform(&batch, &target).unwrap();
    assert_eq!(out.schema(), target);

    let l = out.column(0).as_list::<i32>();
    assert!(l.is_null(1));
    let values = l.value(0);
    assert_eq!(values.as_primitive::<Int64Type>().values(), &[1, 2]);

    let m = out.column(1).as_map();
    assert!(m.is_null(1));
    assert_eq!(m.keys().as_string::<i32>().value(0), "a");
    assert_eq!(m.values().as_primitive::<Int64Type>().value(0), 7);
}
