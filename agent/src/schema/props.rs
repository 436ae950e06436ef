//! Property tests of inference and evolution, and a fuzz test of the tracker with the
//! batch encoder: whatever the tracker accepts, the Arrow encoder must encode.

use std::sync::Arc;

use iceberg::spec::{Schema, Type};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::SchemaTracker;
use crate::batch::BatchEncoder;
use crate::source::KafkaRecord;

/// A JSON value of one "family" of types that never conflict with each other
/// (numbers, strings incl. timestamps, booleans, structs of those, lists of numbers).
fn family_value(family: usize) -> BoxedStrategy<Value> {
    let null = Just(Value::Null);
    match family % 5 {
        0 => prop_oneof![
            null,
            any::<i32>().prop_map(|i| json!(i)),
            (-1e6f64..1e6).prop_map(|f| json!(f + 0.5)),
        ]
        .boxed(),
        1 => prop_oneof![
            null,
            Just(json!("2024-01-02T03:04:05Z")),
            Just(json!("2024-01-02T03:04:05")),
            "[a-z]{0,5}".prop_map(Value::String),
        ]
        .boxed(),
        2 => prop_oneof![null, any::<bool>().prop_map(Value::Bool)].boxed(),
        3 => proptest::collection::btree_map("[a-c]", family_leaf(), 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
            .boxed(),
        _ => proptest::collection::vec(any::<i16>().prop_map(|i| json!(i)), 0..3)
            .prop_map(Value::Array)
            .boxed(),
    }
}

/// Struct members: one family per member name so they do not conflict either.
fn family_leaf() -> BoxedStrategy<Value> {
    prop_oneof![Just(Value::Null), any::<i64>().prop_map(|i| json!(i))].boxed()
}

fn consistent_records() -> impl Strategy<Value = Vec<Map<String, Value>>> {
    let record =
        proptest::collection::vec(proptest::option::of(any::<u8>()), 5).prop_flat_map(|present| {
            let fields: Vec<BoxedStrategy<(String, Value)>> = present
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_some())
                .map(|(i, _)| {
                    family_value(i)
                        .prop_map(move |v| (format!("f{i}"), v))
                        .boxed()
                })
                .collect();
            fields.prop_map(|kv| kv.into_iter().collect::<Map<String, Value>>())
        });
    proptest::collection::vec(record, 1..8)
}

/// Any JSON value, conflicts included (for the fuzz test).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        "[a-z0-9 :.TZ+-]{0,25}".prop_map(Value::String),
        Just(json!("2024-01-02T03:04:05.123Z")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn any_records() -> impl Strategy<Value = Vec<Map<String, Value>>> {
    proptest::collection::vec(
        proptest::collection::btree_map("[a-e]", any_json(), 0..5)
            .prop_map(|m| m.into_iter().collect::<Map<String, Value>>()),
        1..10,
    )
}

/// A type with struct members sorted by name (column order follows first appearance).
fn canon(t: &Type) -> String {
    match t {
        Type::Struct(s) => {
            let mut fields: Vec<String> = s
                .fields()
                .iter()
                .map(|f| format!("{}: {}", f.name, canon(&f.field_type)))
                .collect();
            fields.sort();
            format!("struct<{}>", fields.join(", "))
        }
        Type::List(l) => format!("list<{}>", canon(&l.element_field.field_type)),
        other => super::type_name(other),
    }
}

fn canon_schema(s: &Schema) -> String {
    canon(&Type::Struct(s.as_struct().clone()))
}

fn learn(records: &[Map<String, Value>]) -> (SchemaTracker, Vec<Map<String, Value>>) {
    let mut t = SchemaTracker::new();
    let accepted = records
        .iter()
        .filter(|r| t.observe(r).is_ok())
        .cloned()
        .collect();
    (t, accepted)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Records of non-conflicting types give the same columns in any order.
    #[test]
    fn inference_is_order_independent(
        (records, shuffled) in consistent_records()
            .prop_flat_map(|r| (Just(r.clone()), Just(r).prop_shuffle()))
    ) {
        let (a, accepted_a) = learn(&records);
        let (b, accepted_b) = learn(&shuffled);
        prop_assert_eq!(accepted_a.len(), records.len());
        prop_assert_eq!(accepted_b.len(), records.len());
        prop_assert_eq!(
            canon_schema(&a.new_table_schema().unwrap()),
            canon_schema(&b.new_table_schema().unwrap())
        );
    }

    /// Observing the same records again changes nothing.
    #[test]
    fn merging_is_idempotent(records in any_records()) {
        let (mut t, accepted) = learn(&records);
        let once = t.new_table_schema().unwrap();
        for r in &accepted {
            prop_assert!(t.observe(r).is_ok(), "an accepted record is accepted again");
        }
        prop_assert_eq!(t.new_table_schema().unwrap(), once);
    }

    /// Evolving a committed schema keeps every field id on its field and numbers new
    /// fields above the last id; evolving again with the same records changes nothing.
    #[test]
    fn field_ids_never_change(first in any_records(), second in any_records()) {
        let (t, _) = learn(&first);
        let table = t.new_table_schema().unwrap();
        let last = table.highest_field_id();
        let mut next = SchemaTracker::from_table(&table);
        let accepted: Vec<_> = second.iter().filter(|r| next.observe(r).is_ok()).cloned().collect();
        if let Some(evolved) = next.evolved_schema(&table, last).unwrap() {
            for (id, name) in table.field_id_to_name_map() {
                prop_assert_eq!(evolved.name_by_field_id(*id), Some(name.as_str()));
            }
            for (id, name) in evolved.field_id_to_name_map() {
                prop_assert!(
                    *id <= last || table.name_by_field_id(*id).is_none(),
                    "new field {} reuses id {}", name, id
                );
            }
            let mut again = SchemaTracker::from_table(&evolved);
            for r in &accepted {
                prop_assert!(again.observe(r).is_ok());
            }
            prop_assert_eq!(again.evolved_schema(&evolved, evolved.highest_field_id()).unwrap(), None);
        }
    }

    /// Fuzz: any records; the accepted ones always encode into Arrow with the inferred schema.
    #[test]
    fn fuzz_accepted_records_always_encode(records in any_records()) {
        let (t, accepted) = learn(&records);
        let schema = t.new_table_schema().unwrap();
        let rows: Vec<KafkaRecord> = accepted
            .iter()
            .enumerate()
            .map(|(i, r)| KafkaRecord {
                topic: Arc::from("t"),
                partition: 0,
                offset: i as i64,
                timestamp_ms: None,
                key: None,
                value: Some(serde_json::to_vec(r).unwrap()),
            })
            .collect();
        let batch = BatchEncoder::new(&schema).unwrap().encode(&rows);
        prop_assert!(batch.is_ok(), "{:?} for {:?}", batch.err(), accepted);
    }
}
