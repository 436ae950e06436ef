//! Property tests of inference and evolution, and a fuzz test of the tracker with the
//! batch encoder: whatever the tracker accepts, the Arrow encoder must encode.

use std::sync::Arc;

use iceberg::spec::{Schema, Type};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::SchemaTracker;
use crate::batch::tests::encode;

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
        let _ = t;
        let rows: Vec<Option<Map<String, Value>>> = accepted.iter().cloned().map(Some).collect();
        let batch = encode(&mut SchemaTracker::new(), |t| t.new_table_schema().unwrap(), &rows);
        prop_assert!(batch.is_ok(), "{:?} for {:?}", batch.err(), accepted);
    }
}

/// `name: type` fields as a declared struct (ids are placeholders).
fn declared(fields: &[(&str, Type)]) -> Arc<iceberg::spec::StructType> {
    use iceberg::spec::NestedField;
    Arc::new(iceberg::spec::StructType::new(
        fields
            .iter()
            .map(|(n, t)| Arc::new(NestedField::optional(0, *n, t.clone())))
            .collect(),
    ))
}

fn decimal(precision: u32) -> Type {
    Type::Primitive(iceberg::spec::PrimitiveType::Decimal {
        precision,
        scale: 2,
    })
}

/// A plain decimal string: up to 12 integer digits, up to 3 fraction digits.
fn decimal_text() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        "[0-9]{1,12}",
        proptest::option::of("[0-9]{1,3}"),
    )
        .prop_map(|(neg, i, f)| {
            let sign = if neg { "-" } else { "" };
            match f {
                Some(f) => format!("{sign}{i}.{f}"),
                None => format!("{sign}{i}"),
            }
        })
}

/// Whether a plain decimal string fits decimal(12,2).
fn fits_12_2(s: &str) -> bool {
    let digits = s.trim_start_matches('-');
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    // Zeros past the scale do not change the value: `1.230` is `1.23`.
    int.trim_start_matches('0').len() <= 10 && frac.trim_end_matches('0').len() <= 2
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Committed `int` / `float` / `decimal(9,2)` columns declared `long` / `double` /
    /// `decimal(12,2)`: a record is accepted exactly when its values fit the wider types,
    /// and the accepted ones encode with the evolved schema to the exact values.
    #[test]
    fn widened_columns_take_exactly_what_fits_and_encode_it(
        values in proptest::collection::vec(
            (any::<i64>(), any::<f32>().prop_filter("finite", |f| f.is_finite()), decimal_text()),
            1..8,
        )
    ) {
        use arrow_array::{Array, Decimal128Array, Float64Array, Int64Array};
        use iceberg::spec::PrimitiveType as P;

        let mut narrow = SchemaTracker::new();
        narrow.declare(&declared(&[
            ("n", Type::Primitive(P::Int)),
            ("r", Type::Primitive(P::Float)),
            ("p", decimal(9)),
        ]));
        let table = narrow.new_table_schema().unwrap();
        let mut t = SchemaTracker::from_table(&table);
        t.declare(&declared(&[
            ("n", Type::Primitive(P::Long)),
            ("r", Type::Primitive(P::Double)),
            ("p", decimal(12)),
        ]));
        let mut accepted = Vec::new();
        for (n, r, p) in &values {
            let record: Map<String, Value> = json!({"n": n, "r": f64::from(*r), "p": p})
                .as_object()
                .unwrap()
                .clone();
            let ok = t.observe(&record).is_ok();
            prop_assert_eq!(ok, fits_12_2(p), "{:?}", record);
            if ok {
                accepted.push((record, *n, f64::from(*r), p.clone()));
            }
        }
        let evolved = t
            .evolved_schema(&table, table.highest_field_id())
            .unwrap()
            .unwrap();
        let rows: Vec<Option<Map<String, Value>>> =
            accepted.iter().map(|(r, ..)| Some(r.clone())).collect();
        let mut again = SchemaTracker::from_table(&table);
        again.declare(&declared(&[
            ("n", Type::Primitive(P::Long)),
            ("r", Type::Primitive(P::Double)),
            ("p", decimal(12)),
        ]));
        let batch = encode(&mut again, |_| evolved.clone(), &rows);
        prop_assert!(batch.is_ok(), "{:?}", batch.err());
        let batch = batch.unwrap();
        let column = |name: &str| batch.column_by_name(name).unwrap().clone();
        let n = column("n");
        let n = n.as_any().downcast_ref::<Int64Array>().unwrap();
        let r = column("r");
        let r = r.as_any().downcast_ref::<Float64Array>().unwrap();
        let p = column("p");
        let p = p.as_any().downcast_ref::<Decimal128Array>().unwrap();
        prop_assert_eq!(p.precision(), 12);
        for (i, (_, want_n, want_r, want_p)) in accepted.iter().enumerate() {
            prop_assert_eq!(n.value(i), *want_n);
            prop_assert_eq!(r.value(i), *want_r);
            prop_assert_eq!(&p.value_as_string(i), &normalize_2(want_p));
        }
    }
}

/// A plain decimal string with exactly two fraction digits, as Arrow prints decimal(_,2).
fn normalize_2(s: &str) -> String {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = &frac[..frac.len().min(2).max(frac.trim_end_matches('0').len())];
    let text = format!("{int}.{frac:0<2}");
    let zero = text.bytes().all(|b| b == b'0' || b == b'.');
    if neg && !zero {
        format!("-{text}")
    } else {
        text
    }
}
