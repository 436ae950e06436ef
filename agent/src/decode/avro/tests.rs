use apache_avro::types::Value as Avro;
use apache_avro::{Days, Decimal, Duration, Millis, Months, to_avro_datum};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::{Array, FixedSizeBinaryArray, LargeBinaryArray};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::batch::tests::encode;
use crate::schema::SchemaTracker;

/// One field of every Avro type and logical type.
pub(crate) const ALL_TYPES: &str = r#"{"type": "record", "name": "All", "namespace": "t", "fields": [
  {"name": "b", "type": "boolean"},
  {"name": "i", "type": "int"},
  {"name": "l", "type": "long"},
  {"name": "f", "type": "float"},
  {"name": "d", "type": "double"},
  {"name": "s", "type": "string"},
  {"name": "by", "type": "bytes"},
  {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
  {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
  {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
  {"name": "decf", "type": {"type": "fixed", "name": "D8", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4}},
  {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
  {"name": "day", "type": {"type": "int", "logicalType": "date"}},
  {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
  {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
  {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "ltm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
  {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
  {"name": "dur", "type": {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}},
  {"name": "opt", "type": ["null", "string"], "default": null},
  {"name": "multi", "type": ["null", "long", "string", "Inner2"]},
  {"name": "arr", "type": {"type": "array", "items": "long"}},
  {"name": "m", "type": {"type": "map", "values": "double"}},
  {"name": "rec", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
  {"name": "recs", "type": {"type": "array", "items": "Inner"}},
  {"name": "nothing", "type": "null"}
]}"#;

const UUID: &str = "5f0c6f2e-8d7a-4a1b-9c3e-0b1d2e3f4a5b";

fn all_types_schema() -> WriterSchema {
    // `Inner2` is referenced by the union before it is defined: define it in a wrapper.
    let text = ALL_TYPES.replace(
        r#""Inner2"]"#,
        r#"{"type": "record", "name": "Inner2", "fields": [{"name": "y", "type": "string"}]}]"#,
    );
    WriterSchema::parse(Some(7), &text).unwrap()
}

fn all_types_value(d: f64, multi: Avro) -> Avro {
    Avro::Record(vec![
        ("b".into(), Avro::Boolean(true)),
        ("i".into(), Avro::Int(-5)),
        ("l".into(), Avro::Long(1 << 40)),
        ("f".into(), Avro::Float(1.5)),
        ("d".into(), Avro::Double(d)),
        ("s".into(), Avro::String("hé".into())),
        ("by".into(), Avro::Bytes(vec![0, 255, 16])),
        ("fx".into(), Avro::Fixed(4, vec![1, 2, 3, 4])),
        ("e".into(), Avro::Enum(1, "GREEN".into())),
        // -12345 unscaled, two's complement big-endian.
        ("dec".into(), Avro::Decimal(Decimal::from(vec![0xcf, 0xc7]))),
        (
            "decf".into(),
            Avro::Decimal(Decimal::from(vec![0, 0, 0, 0, 0, 0, 0x30, 0x39])),
        ),
        ("u".into(), Avro::Uuid(uuid::Uuid::parse_str(UUID).unwrap())),
        ("day".into(), Avro::Date(19_724)),
        ("tm".into(), Avro::TimeMillis(11_045_123)),
        ("tu".into(), Avro::TimeMicros(11_045_123_456)),
        ("tsm".into(), Avro::TimestampMillis(1_704_164_645_123)),
        ("tsu".into(), Avro::TimestampMicros(1_704_164_645_123_456)),
        ("ltm".into(), Avro::LocalTimestampMillis(1_704_164_645_123)),
        (
            "ltu".into(),
            Avro::LocalTimestampMicros(1_704_164_645_123_456),
        ),
        (
            "dur".into(),
            Avro::Duration(Duration::new(Months::new(1), Days::new(2), Millis::new(3))),
        ),
        ("opt".into(), Avro::Union(0, Box::new(Avro::Null))),
        ("multi".into(), multi),
        (
            "arr".into(),
            Avro::Array(vec![Avro::Long(1), Avro::Long(2)]),
        ),
        (
            "m".into(),
            Avro::Map(
                [
                    ("b".to_string(), Avro::Double(1.0)),
                    ("a".into(), Avro::Double(0.5)),
                ]
                .into_iter()
                .collect(),
            ),
        ),
        ("rec".into(), Avro::Record(vec![("x".into(), Avro::Int(7))])),
        (
            "recs".into(),
            Avro::Array(vec![Avro::Record(vec![("x".into(), Avro::Int(1))])]),
        ),
        ("nothing".into(), Avro::Null),
    ])
}

#[test]
fn every_avro_type_maps_to_its_iceberg_type() {
    let schema = all_types_schema();
    crate::decode::assert_columns(
        &schema.columns,
        &[
            ("b", "boolean"),
            ("i", "int"),
            ("l", "long"),
            ("f", "float"),
            ("d", "double"),
            ("s", "string"),
            ("by", "binary"),
            ("fx", "fixed(4)"),
            ("e", "string"),
            ("dec", "decimal(10, 2)"),
            ("decf", "decimal(18, 4)"),
            ("u", "uuid"),
            ("day", "date"),
            ("tm", "time"),
            ("tu", "time"),
            ("tsm", "timestamptz"),
            ("tsu", "timestamptz"),
            ("ltm", "timestamp"),
            ("ltu", "timestamp"),
            ("dur", "fixed(12)"),
            ("opt", "string"),
            (
                "multi",
                "struct<long: long, string: string, Inner2: struct<y: string>>",
            ),
            ("arr", "list<long>"),
            ("m", "map<string, double>"),
            ("rec", "struct<x: int>"),
            ("recs", "list<struct<x: int>>"),
        ],
        "`nothing` (null) has no column",
    );
}

#[test]
fn values_become_the_documented_json() {
    let schema = all_types_schema();
    let multi = Avro::Union(2, Box::new(Avro::String("x".into())));
    let bytes = to_avro_datum(&schema.schema, all_types_value(2.25, multi)).unwrap();
    let got = schema.decode(&bytes).unwrap().to_serde();
    assert_eq!(
        got,
        json!({
            "b": true, "i": -5, "l": 1_099_511_627_776_i64, "f": 1.5, "d": 2.25, "s": "hé",
            "by": "00ff10", "fx": "01020304", "e": "GREEN",
            "dec": "-123.45", "decf": "1.2345", "u": UUID,
            "day": "2024-01-02", "tm": "03:04:05.123000", "tu": "03:04:05.123456",
            "tsm": "2024-01-02T03:04:05.123000Z", "tsu": "2024-01-02T03:04:05.123456Z",
            "ltm": "2024-01-02T03:04:05.123000", "ltu": "2024-01-02T03:04:05.123456",
            "dur": "010000000200000003000000",
            "opt": null, "multi": {"string": "x"}, "arr": [1, 2], "m": {"a": 0.5, "b": 1.0},
            "rec": {"x": 7}, "recs": [{"x": 1}], "nothing": null
        })
    );
}

/// The JSON representation goes through the Arrow encoder into the declared types.
#[test]
fn decoded_values_encode_into_the_declared_columns() {
    let schema = all_types_schema();
    let mut rows = Vec::new();
    let values = [
        all_types_value(2.25, Avro::Union(1, Box::new(Avro::Long(9)))),
        all_types_value(
            f64::NAN,
            Avro::Union(
                3,
                Box::new(Avro::Record(vec![("y".into(), Avro::String("z".into()))])),
            ),
        ),
    ];
    for v in values {
        let object = schema
            .decode(&to_avro_datum(&schema.schema, v).unwrap())
            .unwrap();
        rows.push(object.to_serde().as_object().cloned());
    }
    let mut tracker = SchemaTracker::new();
    tracker.declare(&schema.columns);
    let batch = encode(&mut tracker, |t| t.new_table_schema().unwrap(), &rows).unwrap();
    let col = |n: &str| batch.column_by_name(n).unwrap().clone();
    assert_eq!(col("i").as_primitive::<Int32Type>().value(0), -5);
    assert_eq!(col("l").as_primitive::<Int64Type>().value(0), 1 << 40);
    assert_eq!(col("f").as_primitive::<Float32Type>().value(0), 1.5);
    assert!(col("d").as_primitive::<Float64Type>().value(1).is_nan());
    assert_eq!(col("dec").as_primitive::<Decimal128Type>().value(0), -12345);
    assert_eq!(col("decf").as_primitive::<Decimal128Type>().value(0), 12345);
    assert_eq!(col("day").as_primitive::<Date32Type>().value(0), 19_724);
    assert_eq!(
        col("tu").as_primitive::<Time64MicrosecondType>().value(0),
        11_045_123_456
    );
    assert_eq!(
        col("tm").as_primitive::<Time64MicrosecondType>().value(0),
        11_045_123_000
    );
    let ts = |n: &str| col(n).as_primitive::<TimestampMicrosecondType>().value(0);
    assert_eq!(ts("tsm"), 1_704_164_645_123_000);
    assert_eq!(ts("tsu"), 1_704_164_645_123_456);
    assert_eq!(ts("ltu"), 1_704_164_645_123_456);
    let uuid_col = col("u");
    let u = uuid_col
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .unwrap();
    assert_eq!(u.value(0), uuid::Uuid::parse_str(UUID).unwrap().as_bytes());
    let fx_col = col("fx");
    let fx = fx_col
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .unwrap();
    assert_eq!(fx.value(0), [1, 2, 3, 4]);
    let by_col = col("by");
    let by = by_col.as_any().downcast_ref::<LargeBinaryArray>().unwrap();
    assert_eq!(by.value(0), [0, 255, 16]);
    assert_eq!(col("m").as_map().value(0).len(), 2);
    let multi = col("multi");
    let multi = multi.as_struct();
    assert_eq!(
        multi
            .column_by_name("long")
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(0),
        9
    );
    assert!(multi.column_by_name("long").unwrap().is_null(1));
    assert!(col("opt").is_null(0));
}

#[test]
fn confluent_header_is_checked() {
    assert_eq!(
        split_confluent(&[0, 0, 0, 1, 2, 9, 9]).unwrap(),
        (258, &[9u8, 9][..])
    );
    assert!(
        split_confluent(&[1, 0, 0, 0, 1])
            .unwrap_err()
            .to_string()
            .contains("magic byte")
    );
    assert!(
        split_confluent(&[0, 0, 1])
            .unwrap_err()
            .to_string()
            .contains("shorter than the 5-byte")
    );
}

#[test]
fn bad_bodies_are_errors() {
    let schema = WriterSchema::parse(
        None,
        r#"{"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}"#,
    )
    .unwrap();
    let good = to_avro_datum(
        &schema.schema,
        Avro::Record(vec![("s".into(), Avro::String("ab".into()))]),
    )
    .unwrap();
    assert_eq!(schema.decode(&good).unwrap().to_serde()["s"], "ab");
    let mut trailing = good.clone();
    trailing.push(0);
    assert!(
        schema
            .decode(&trailing)
            .unwrap_err()
            .to_string()
            .contains("trailing")
    );
    let truncated = schema.decode(&good[..1]);
    assert!(
        matches!(truncated, Err(DecodeError::NotAvro(_))),
        "{truncated:?}"
    );
}

#[test]
fn unusable_schemas_are_rejected_with_reason() {
    let recursive = r#"{"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}"#;
    let e = WriterSchema::parse(Some(3), recursive).unwrap_err();
    assert!(e.to_string().contains("recursive"), "{e}");
    assert!(e.to_string().contains("id 3"), "{e}");
    assert!(WriterSchema::parse(None, "{not json").is_err());
    // A primitive schema parses (keys) but declares no column.
    assert!(
        WriterSchema::parse(None, r#""string""#)
            .unwrap()
            .columns
            .fields()
            .is_empty()
    );
}

#[test]
fn decimal_text_is_exact() {
    assert_eq!(decimal_text(&[], 2), "0.00");
    assert_eq!(decimal_text(&[0x30, 0x39], 0), "12345");
    assert_eq!(decimal_text(&[0x30, 0x39], 5), "0.12345");
    assert_eq!(decimal_text(&[0x30, 0x39], 7), "0.0012345");
    assert_eq!(decimal_text(&[0xff], 1), "-0.1");
    assert_eq!(
        decimal_text(&[0x80, 0, 0, 0, 0, 0, 0, 0], 0),
        "-9223372036854775808"
    );
    // 10^38 - 1: the largest decimal(38, s).
    let big: i128 = 10_i128.pow(38) - 1;
    assert_eq!(
        decimal_text(&big.to_be_bytes(), 10),
        "9999999999999999999999999999.9999999999"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Fuzz: arbitrary bytes never panic the Avro decoder or the header parser.
    #[test]
    fn fuzz_avro_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let schema = all_types_schema();
        let _ = schema.decode(&bytes);
        let _ = split_confluent(&bytes);
    }

    /// Fuzz: valid records with one byte flipped still never panic.
    #[test]
    fn fuzz_corrupted_avro_never_panics(at in any::<prop::sample::Index>(), xor in 1u8..) {
        let schema = all_types_schema();
        let mut bytes = to_avro_datum(
            &schema.schema,
            all_types_value(1.0, Avro::Union(0, Box::new(Avro::Null))),
        )
        .unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        let _ = schema.decode(&bytes);
    }
}

#[test]
fn a_schema_the_avro_library_panics_on_is_a_bad_schema() {
    // apache-avro 0.21 unwraps the record name (as in
    // `fuzz/seeds/registry_response/crash-invalid-record-name.json`).
    let text = r#"{"type":"record","name":"nod-e","fields":[{"name":"v","type":"int"}]}"#;
    match WriterSchema::parse(Some(3), text) {
        Err(DecodeError::BadSchema { id, reason }) => {
            assert_eq!(id, Some(3));
            assert!(reason.contains("cannot parse"), "{reason}");
        }
        other => panic!("expected a bad schema, got {:?}", other.map(|_| ())),
    }
}
