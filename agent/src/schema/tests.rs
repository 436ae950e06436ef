use serde_json::json;

use super::*;

fn obj(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().unwrap().clone()
}

/// An optional primitive field.
fn optional(id: i32, name: &str, ty: iceberg::spec::PrimitiveType) -> std::sync::Arc<NestedField> {
    std::sync::Arc::new(NestedField::optional(id, name, Type::Primitive(ty)))
}

/// A required primitive field.
fn required(id: i32, name: &str, ty: iceberg::spec::PrimitiveType) -> std::sync::Arc<NestedField> {
    std::sync::Arc::new(NestedField::required(id, name, Type::Primitive(ty)))
}

fn decimal(precision: u32, scale: u32) -> iceberg::spec::PrimitiveType {
    iceberg::spec::PrimitiveType::Decimal { precision, scale }
}

/// The type conflict of a rejection (panics on other rejections: a test helper).
fn conflict(r: Rejection) -> Conflict {
    match r {
        Rejection::Conflict(c) => c,
        other => panic!("expected a type conflict, got {other}"),
    }
}

fn learn(records: &[serde_json::Value]) -> SchemaTracker {
    let mut t = SchemaTracker::new();
    for r in records {
        t.observe(&obj(r.clone())).unwrap();
    }
    t
}

fn types(t: &SchemaTracker) -> Vec<(String, String)> {
    t.additions()
        .into_iter()
        .map(|a| (a.name, type_name(&a.field_type)))
        .collect()
}

#[test]
fn infers_the_documented_mapping() {
    let t = learn(&[json!({
        "id": 1, "amount": 2.5, "ok": true, "name": "x",
        "at": "2024-01-02T03:04:05Z", "local": "2024-01-02 03:04:05.5", "day": "2024-01-02",
        "user": {"n": 1}, "tags": ["a"], "nothing": null, "empty": [], "blank": {}
    })]);
    let schema = t.new_table_schema().unwrap();
    let names: Vec<_> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.name.clone(), type_name(&f.field_type)))
        .collect();
    let expect = [
        ("_kafka_partition", "int"),
        ("_kafka_offset", "long"),
        ("_kafka_timestamp", "timestamptz"),
        ("_kafka_key", "string"),
        ("id", "long"),
        ("amount", "double"),
        ("ok", "boolean"),
        ("name", "string"),
        ("at", "timestamptz"),
        ("local", "timestamp"),
        ("day", "string"),
    ];
    for (i, (n, ty)) in expect.iter().enumerate() {
        assert_eq!((names[i].0.as_str(), names[i].1.as_str()), (*n, *ty));
    }
    assert_eq!(
        type_name(&schema.field_by_name("user").unwrap().field_type),
        "struct<n: long>"
    );
    assert_eq!(
        type_name(&schema.field_by_name("tags").unwrap().field_type),
        "list<string>"
    );
    for absent in ["nothing", "empty", "blank"] {
        assert!(
            schema.field_by_name(absent).is_none(),
            "{absent} has no type yet"
        );
    }
}

#[test]
fn widens_before_commit_only() {
    let t = learn(&[
        json!({"a": 1, "ts": "2024-01-01T00:00:00Z"}),
        json!({"a": 1.5, "ts": "later"}),
    ]);
    assert_eq!(
        types(&t),
        [
            ("a".into(), "double".into()),
            ("ts".into(), "string".into())
        ]
    );

    let schema = learn(&[json!({"a": 1, "s": {"x": true}})])
        .new_table_schema()
        .unwrap();
    let mut locked = SchemaTracker::from_table(&schema);
    let e = locked.observe(&obj(json!({"a": 1.5}))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "field `a`: column is long, value is number with fraction 1.5"
    );
    let e = conflict(
        locked
            .observe(&obj(json!({"s": {"x": "yes"}})))
            .unwrap_err(),
    );
    assert_eq!(e.path, "s.x");
    assert_eq!(
        locked,
        SchemaTracker::from_table(&schema),
        "a conflicting record changes nothing"
    );
    locked
        .observe(&obj(
            json!({"a": null, "s": {"x": false, "y": 1}, "new": "n"}),
        ))
        .unwrap();
    let adds = locked.additions();
    assert_eq!(adds.len(), 2);
    assert_eq!(
        (adds[0].parent.as_deref(), adds[0].name.as_str()),
        (Some("s"), "y")
    );
    assert_eq!(
        (adds[1].parent.as_deref(), adds[1].name.as_str()),
        (None, "new")
    );
}

#[test]
fn nulls_wait_for_a_type_and_lists_merge_elements() {
    let t = learn(&[
        json!({"a": null, "l": [1, null, 2.5]}),
        json!({"a": "x", "l": []}),
    ]);
    assert_eq!(
        types(&t),
        [
            ("a".into(), "string".into()),
            ("l".into(), "list<double>".into())
        ]
    );
}

#[test]
fn reserved_columns_in_payload_are_ignored() {
    let t = learn(&[json!({"_kafka_offset": "x", "v": 1})]);
    assert_eq!(types(&t), [("v".into(), "long".into())]);
}

#[test]
fn timestamp_detection_is_strict() {
    assert_eq!(timestamp_shape("2024-01-02T03:04:05Z"), Some(true));
    assert_eq!(
        timestamp_shape("2024-01-02T03:04:05.123456+02:00"),
        Some(true)
    );
    assert_eq!(timestamp_shape("2024-01-02 03:04:05-0700"), Some(true));
    assert_eq!(timestamp_shape("2024-01-02T03:04:05"), Some(false));
    assert_eq!(timestamp_shape("2024-13-02T03:04:05Z"), None);
    assert_eq!(
        timestamp_shape("2023-02-29T03:04:05Z"),
        None,
        "no leap day in 2023"
    );
    assert_eq!(timestamp_shape("2024-02-29T23:59:59Z"), Some(true));
    assert_eq!(timestamp_shape("2024-01-02T24:00:00Z"), None);
    assert_eq!(timestamp_shape("2024-01-02T03:04:05+24:00"), None);
    assert_eq!(timestamp_shape("2024-01-02T03:04:05-07:60"), None);
    assert_eq!(timestamp_shape("2024-01-02"), None);
    assert_eq!(timestamp_shape("2024-01-02T03:04:05Zjunk"), None);
    assert_eq!(timestamp_shape("hello world, this is text"), None);
}

#[test]
fn learning_is_order_independent_for_compatible_records() {
    let records = [
        json!({"a": 1, "b": {"c": "x"}}),
        json!({"a": 2.5, "d": [true]}),
        json!({"b": {"e": 1}, "a": null}),
    ];
    let forward = types(&learn(&records));
    let mut rev = records.to_vec();
    rev.reverse();
    let mut backward = types(&learn(&rev));
    // Column order follows first appearance; the set of columns and their types do not depend on order.
    let canonical = |cols: &[(String, String)]| {
        let mut v: Vec<(String, String)> = cols
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.replace("e: long, c: string", "c: string, e: long"),
                )
            })
            .collect();
        v.sort();
        v
    };
    backward.sort();
    assert_eq!(canonical(&forward), canonical(&backward));
    let twice = learn(&[records.to_vec(), records.to_vec()].concat());
    assert_eq!(
        types(&twice),
        forward,
        "observing the same records again changes nothing"
    );
}

#[test]
fn evolved_schema_keeps_ids_and_identifier_fields_and_widens() {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, StructType};

    let table = Schema::builder()
        .with_schema_id(3)
        .with_identifier_field_ids([1])
        .with_fields(vec![
            required(1, "id", PrimitiveType::Long),
            optional(2, "n", PrimitiveType::Int),
            optional(3, "price", decimal(9, 2)),
        ])
        .build()
        .unwrap();
    let mut tracker = SchemaTracker::from_table(&table);
    assert_eq!(
        tracker.evolved_schema(&table, 10).unwrap(),
        None,
        "nothing learnt, nothing to commit"
    );
    // A value that does not fit the committed int is refused while nothing declares a widening.
    assert!(
        tracker
            .observe(&obj(json!({"n": 3_000_000_000_i64})))
            .is_err()
    );
    let declared = Arc::new(StructType::new(vec![
        optional(0, "n", PrimitiveType::Long),
        optional(0, "price", decimal(12, 2)),
        Arc::new(NestedField::optional(
            0,
            "tags",
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                0,
                Type::Primitive(PrimitiveType::String),
                false,
            )))),
        )),
    ]));
    tracker.declare(&declared);
    // Declared widenings are committed with the data: values only need to fit the wider type.
    assert!(
        tracker
            .observe(&obj(
                json!({"n": 3_000_000_000_i64, "price": "1234567890.12"})
            ))
            .is_ok()
    );
    // A value that does not fit even the wider type still conflicts, naming that type.
    let e = conflict(
        tracker
            .observe(&obj(json!({"price": "12345678901.12"})))
            .unwrap_err(),
    );
    assert_eq!(
        (e.path.as_str(), e.column.as_str()),
        ("price", "decimal(12, 2)")
    );
    let e = conflict(
        tracker
            .observe(&obj(json!({"price": "1.125"})))
            .unwrap_err(),
    );
    assert_eq!(e.column, "decimal(12, 2)", "the scale does not change");
    let next = tracker.evolved_schema(&table, 10).unwrap().unwrap();
    assert_eq!(next.schema_id(), 4);
    assert_eq!(next.identifier_field_ids().collect::<Vec<_>>(), [1]);
    let field = |name: &str| next.field_by_name(name).unwrap().clone();
    assert_eq!(
        (field("id").id, type_name(&field("id").field_type).as_str()),
        (1, "long")
    );
    assert_eq!(
        (field("n").id, type_name(&field("n").field_type).as_str()),
        (2, "long")
    );
    assert_eq!(
        (
            field("price").id,
            type_name(&field("price").field_type).as_str()
        ),
        (3, "decimal(12, 2)")
    );
    assert_eq!(field("tags").id, 11, "new ids start above last_column_id");
    let Type::List(list) = &*field("tags").field_type else {
        panic!("tags is a list");
    };
    assert_eq!(list.element_field.id, 12);
    // After the commit the tracker starts from the evolved table: wide values fit.
    let mut after = SchemaTracker::from_table(&next);
    assert!(after.observe(&obj(json!({"n": 3_000_000_000_i64}))).is_ok());
    assert_eq!(after.evolved_schema(&next, 12).unwrap(), None);
}

#[test]
fn declared_types_do_not_widen_by_inference() {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, StructType};

    let mut t = SchemaTracker::new();
    t.declare(&Arc::new(StructType::new(vec![Arc::new(
        NestedField::optional(0, "at", Type::Primitive(PrimitiveType::Timestamptz)),
    )])));
    assert!(
        t.observe(&obj(json!({"at": "2024-01-01T00:00:00Z"})))
            .is_ok()
    );
    let e = conflict(t.observe(&obj(json!({"at": "yesterday"}))).unwrap_err());
    assert_eq!(
        e.column, "timestamptz",
        "a declared column does not turn into a string"
    );
}

/// A committed table with `n: int` and `price: decimal(9,2)`.
fn narrow_table() -> Schema {
    use iceberg::spec::PrimitiveType;

    Schema::builder()
        .with_fields(vec![
            optional(1, "n", PrimitiveType::Int),
            optional(2, "price", decimal(9, 2)),
        ])
        .build()
        .unwrap()
}

fn declared_price(precision: u32) -> std::sync::Arc<iceberg::spec::StructType> {
    use iceberg::spec::{NestedField, PrimitiveType, StructType};

    std::sync::Arc::new(StructType::new(vec![std::sync::Arc::new(
        NestedField::optional(
            0,
            "price",
            Type::Primitive(PrimitiveType::Decimal {
                precision,
                scale: 2,
            }),
        ),
    )]))
}

#[test]
fn hints_widen_committed_columns() {
    use iceberg::spec::{PrimitiveType, StructType};

    // Through plugins the writer schema is a hint per record, not a declaration.
    let table = narrow_table();
    let hints = StructType::new(vec![optional(0, "n", PrimitiveType::Long)]);
    let mut t = SchemaTracker::from_table(&table);
    let wide = obj(json!({"n": 3_000_000_000_i64}));
    assert!(t.observe(&wide).is_err(), "without the hint it conflicts");
    assert!(
        t.observe_with(&obj(json!({"n": null})), Some(&hints))
            .is_ok()
    );
    assert_eq!(
        t.evolved_schema(&table, 2).unwrap(),
        None,
        "a null value does not widen"
    );
    assert!(t.observe_with(&wide, Some(&hints)).is_ok());
    let next = t.evolved_schema(&table, 2).unwrap().unwrap();
    assert_eq!(
        type_name(&next.field_by_name("n").unwrap().field_type),
        "long"
    );
    assert_eq!(next.field_by_name("n").unwrap().id, 1);
    // Once widened, the column takes wide values without the hint too.
    assert!(t.observe(&wide).is_ok());
}

#[test]
fn a_later_declaration_never_narrows_a_widening() {
    let table = narrow_table();
    let mut t = SchemaTracker::from_table(&table);
    t.declare(&declared_price(12));
    let big = obj(json!({"price": "1234567890.12"}));
    assert!(t.observe(&big).is_ok());
    // A later writer schema with less precision than the first: values already accepted
    // for decimal(12,2) must still fit the committed type.
    t.declare(&declared_price(10));
    let next = t.evolved_schema(&table, 2).unwrap().unwrap();
    assert_eq!(
        type_name(&next.field_by_name("price").unwrap().field_type),
        "decimal(12, 2)"
    );
    t.declare(&declared_price(14));
    let next = t.evolved_schema(&table, 2).unwrap().unwrap();
    assert_eq!(
        type_name(&next.field_by_name("price").unwrap().field_type),
        "decimal(14, 2)"
    );
}

#[test]
fn float_columns_refuse_what_an_f32_cannot_hold() {
    use iceberg::spec::PrimitiveType;

    let float = Type::Primitive(PrimitiveType::Float);
    assert!(type_accepts(&float, &json!(3.0e38)));
    assert!(type_accepts(&float, &json!(-1.5)));
    assert!(
        !type_accepts(&float, &json!(1e300)),
        "would read as infinity"
    );
    assert!(type_accepts(
        &Type::Primitive(PrimitiveType::Double),
        &json!(1e300)
    ));
}

#[test]
fn a_double_hint_widens_a_float_column_even_for_values_a_float_holds() {
    use iceberg::spec::{PrimitiveType, StructType};

    let float = |t| {
        Schema::builder()
            .with_fields(vec![optional(1, "r", t)])
            .build()
            .unwrap()
    };
    let table = float(PrimitiveType::Float);
    let hints = StructType::new(vec![optional(0, "r", PrimitiveType::Double)]);
    let mut t = SchemaTracker::from_table(&table);
    // 1.1 "fits" a float only by rounding: stored as a float it would read 1.100000023841858.
    assert!(
        t.observe_with(&obj(json!({"r": 1.1})), Some(&hints))
            .is_ok()
    );
    let next = t.evolved_schema(&table, 1).unwrap().unwrap();
    assert_eq!(
        type_name(&next.field_by_name("r").unwrap().field_type),
        "double"
    );
}

#[test]
fn nested_widenings_keep_their_ids() {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, StructType};

    let lines = |qty: PrimitiveType, id: i32| {
        Type::List(ListType::new(Arc::new(NestedField::list_element(
            id,
            Type::Struct(StructType::new(vec![optional(id + 1, "qty", qty)])),
            false,
        ))))
    };
    let table = Schema::builder()
        .with_fields(vec![Arc::new(NestedField::optional(
            1,
            "lines",
            lines(PrimitiveType::Int, 2),
        ))])
        .build()
        .unwrap();
    let mut t = SchemaTracker::from_table(&table);
    let record = obj(json!({"lines": [{"qty": 1}, {"qty": 3_000_000_000_i64}]}));
    assert!(t.observe(&record).is_err());
    t.declare(&Arc::new(StructType::new(vec![Arc::new(
        NestedField::optional(0, "lines", lines(PrimitiveType::Long, 0)),
    )])));
    assert!(t.observe(&record).is_ok());
    let next = t.evolved_schema(&table, 3).unwrap().unwrap();
    assert_eq!(
        next.field_by_name("lines").unwrap().field_type.as_ref(),
        &lines(PrimitiveType::Long, 2),
        "element and member ids unchanged, the member widened"
    );
}

/// Buffered columns are checked against the table as another writer may have left it:
/// a type it widened, or a declared widening this commit applies, fit; a column it gave
/// an incompatible type is a conflict, nested ones included.
#[test]
fn buffered_columns_are_checked_against_the_tables_types() {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, StructType};

    let field = |id: i32, name: &str, t: Type| Arc::new(NestedField::optional(id, name, t));
    let long = || Type::Primitive(PrimitiveType::Long);
    let int = || Type::Primitive(PrimitiveType::Int);
    let table = Schema::builder()
        .with_fields(vec![
            field(1, "x", long()),
            field(2, "d", Type::Primitive(PrimitiveType::Double)),
            field(3, "n", long()),
            field(
                4,
                "s",
                Type::Struct(StructType::new(vec![field(5, "k", long())])),
            ),
        ])
        .build()
        .unwrap();
    // Nothing buffered that the table has: fits.
    let mut t = SchemaTracker::new();
    t.observe(&obj(json!({"other": "a"}))).unwrap();
    assert_eq!(t.conflict_with(&table), None);
    // A string where the table has a long.
    let mut t = SchemaTracker::new();
    t.observe(&obj(json!({"x": "abc"}))).unwrap();
    let c = t.conflict_with(&table).expect("conflict");
    assert!(
        c.contains("`x`: string in the buffered rows, long in the table"),
        "{c}"
    );
    // Inference would have widened long to double itself.
    let mut t = SchemaTracker::new();
    t.observe(&obj(json!({"d": 5}))).unwrap();
    assert_eq!(t.conflict_with(&table), None);
    // Nested: s.k is a string here.
    let mut t = SchemaTracker::new();
    t.observe(&obj(json!({"s": {"k": "v"}}))).unwrap();
    assert!(t.conflict_with(&table).expect("conflict").contains("`s.k`"));
    // Committed as int by us, widened to long by another writer: fits.
    let ours = Schema::builder()
        .with_fields(vec![field(3, "n", int())])
        .build()
        .unwrap();
    assert_eq!(SchemaTracker::from_table(&ours).conflict_with(&table), None);
    // A declared widening (int -> long) this commit applies to an int column: fits.
    let mut t = SchemaTracker::from_table(&ours);
    t.declare(&Arc::new(StructType::new(vec![field(3, "n", long())])));
    assert_eq!(t.conflict_with(&ours), None);
}

#[test]
fn a_declared_map_column_fits_the_table_created_from_it() {
    use std::sync::Arc;

    use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType};

    // A map as a Protobuf or Avro schema declares it, with the decoder's field ids; the
    // table created from it numbers its fields itself.
    let map = |key_id: i32, value_id: i32| {
        Type::Map(MapType::new(
            Arc::new(NestedField::map_key_element(
                key_id,
                Type::Primitive(PrimitiveType::String),
            )),
            Arc::new(NestedField::map_value_element(
                value_id,
                Type::Primitive(PrimitiveType::Long),
                false,
            )),
        ))
    };
    let list_of_maps = |id: i32, key_id: i32, value_id: i32| {
        Type::List(ListType::new(Arc::new(NestedField::list_element(
            id,
            map(key_id, value_id),
            false,
        ))))
    };
    let mut t = SchemaTracker::new();
    t.declare(&Arc::new(StructType::new(vec![
        Arc::new(NestedField::optional(1, "counters", map(100, 101))),
        Arc::new(NestedField::optional(
            2,
            "history",
            list_of_maps(102, 103, 104),
        )),
    ])));
    let table = t.new_table_schema().unwrap();
    assert_eq!(t.conflict_with(&table), None, "{table:?}");
    assert_eq!(
        t.evolved_schema(&table, table.highest_field_id()).unwrap(),
        None
    );
    // Another value type is still a conflict.
    let other = Schema::builder()
        .with_fields(vec![Arc::new(NestedField::optional(
            1,
            "counters",
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(
                    7,
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::map_value_element(
                    8,
                    Type::Primitive(PrimitiveType::String),
                    false,
                )),
            )),
        ))])
        .build()
        .unwrap();
    assert!(t.conflict_with(&other).is_some());
}

#[test]
fn a_record_whose_key_cannot_be_one_teaches_the_new_table_nothing() {
    use crate::record::json::JsonObject;
    use crate::record::key::KeySpec;

    let mut stage = TableSchema::new(
        SchemaTracker::new(),
        OnIncompatible::DeadLetter,
        Some(KeySpec::from_config(&["id".to_string()])),
    );
    for bad in [
        json!({"id": 1.5, "n": 1}),
        json!({"id": true}),
        json!({"id": {"a": 1}}),
    ] {
        let record = JsonObject::from_map(&obj(bad.clone()));
        match stage.admit(Some(record.view().root()), None, None, None) {
            Admission::Reject { stage, .. } => assert_eq!(stage, "key", "{bad}"),
            other => panic!("{bad} was not refused: {other:?}"),
        }
    }
    let good = JsonObject::from_map(&obj(json!({"id": 7, "n": 2})));
    assert!(matches!(
        stage.admit(Some(good.view().root()), None, None, None),
        Admission::Admit(_)
    ));
    // The key column is a long, as the good record says, so the table can be created.
    assert_eq!(
        types(&stage.tracker),
        [
            ("id".to_string(), "long".to_string()),
            ("n".to_string(), "long".to_string())
        ]
    );
}
