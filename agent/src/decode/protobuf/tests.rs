use base64::Engine;
use proptest::prelude::*;
use prost::Message as _;
use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value as PValue};
use serde_json::{Value, json};

use super::*;

const COMMON: &str = r#"
syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
enum Status { STATUS_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
"#;

const ORDER: &str = r#"
syntax = "proto3";
package shop;
import "shop/common.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/empty.proto";

message Order {
  int64 id = 1;
  string customer = 2;
  shop.common.Money total = 3;
  shop.common.Status status = 4;
  repeated Line lines = 5;
  map<string, int32> counts = 6;
  oneof payment { string card = 7; Transfer transfer = 8; }
  google.protobuf.Timestamp placed_at = 9;
  google.protobuf.Duration wait = 10;
  google.protobuf.StringValue coupon = 11;
  optional int32 priority = 12;
  bytes blob = 13;
  uint64 big = 14;
  double d = 15;
  float f = 16;
  bool flag = 17;
  sint32 s32 = 18;
  fixed32 fx = 19;
  google.protobuf.Struct extra = 20;
  google.protobuf.Int32Value maybe = 21;
  google.protobuf.Empty nothing = 22;
  repeated string tags = 23;

  message Line { string sku = 1; int32 qty = 2; }
  message Transfer { string iban = 1; }
}

message Other { string x = 1; }
"#;

fn schema() -> ProtoSchema {
    ProtoSchema::from_registry(
        7,
        ORDER,
        &[("shop/common.proto".to_string(), COMMON.to_string())],
    )
    .unwrap()
}

fn order_message(schema: &ProtoSchema) -> Arc<ProtoMessage> {
    schema.message(&[0]).unwrap()
}

fn decode(message: &ProtoMessage, bytes: &[u8]) -> Value {
    let mut out = Vec::new();
    message.decode(bytes, &mut out).unwrap();
    serde_json::from_slice(&out).unwrap()
}

fn sub(m: &MessageDescriptor, field: &str) -> DynamicMessage {
    let f = m.get_field_by_name(field).unwrap();
    match f.kind() {
        prost_reflect::Kind::Message(d) => DynamicMessage::new(d),
        other => panic!("{field} is {other:?}"),
    }
}

fn full_order(message: &ProtoMessage) -> DynamicMessage {
    let d = message.descriptor.clone();
    let mut m = DynamicMessage::new(d.clone());
    m.set_field_by_name("id", PValue::I64(42));
    m.set_field_by_name("customer", PValue::String("hé \"q\"".into()));
    let mut total = sub(&d, "total");
    total.set_field_by_name("currency", PValue::String("EUR".into()));
    total.set_field_by_name("units", PValue::I64(-5));
    m.set_field_by_name("total", PValue::Message(total));
    m.set_field_by_name("status", PValue::EnumNumber(2));
    let mut line = sub(&d, "lines");
    line.set_field_by_name("sku", PValue::String("a".into()));
    line.set_field_by_name("qty", PValue::I32(3));
    m.set_field_by_name("lines", PValue::List(vec![PValue::Message(line)]));
    m.set_field_by_name(
        "counts",
        PValue::Map(
            [
                (MapKey::String("b".into()), PValue::I32(2)),
                (MapKey::String("a".into()), PValue::I32(1)),
            ]
            .into_iter()
            .collect(),
        ),
    );
    let mut transfer = sub(&d, "transfer");
    transfer.set_field_by_name("iban", PValue::String("DE00".into()));
    m.set_field_by_name("transfer", PValue::Message(transfer));
    let mut ts = sub(&d, "placed_at");
    ts.set_field_by_name("seconds", PValue::I64(1_704_164_645));
    ts.set_field_by_name("nanos", PValue::I32(123_456_789));
    m.set_field_by_name("placed_at", PValue::Message(ts));
    let mut wait = sub(&d, "wait");
    wait.set_field_by_name("seconds", PValue::I64(90));
    wait.set_field_by_name("nanos", PValue::I32(500_000_000));
    m.set_field_by_name("wait", PValue::Message(wait));
    let mut coupon = sub(&d, "coupon");
    coupon.set_field_by_name("value", PValue::String("C1".into()));
    m.set_field_by_name("coupon", PValue::Message(coupon));
    m.set_field_by_name("priority", PValue::I32(0));
    m.set_field_by_name("blob", PValue::Bytes(vec![0, 255, 16].into()));
    m.set_field_by_name("big", PValue::U64(u64::MAX));
    m.set_field_by_name("d", PValue::F64(f64::NAN));
    m.set_field_by_name("f", PValue::F32(1.5));
    m.set_field_by_name("flag", PValue::Bool(true));
    m.set_field_by_name("s32", PValue::I32(-7));
    m.set_field_by_name("fx", PValue::U32(u32::MAX));
    let extra = sub(&d, "extra");
    let value_desc = extra
        .descriptor()
        .get_field_by_name("fields")
        .unwrap()
        .kind()
        .as_message()
        .unwrap()
        .map_entry_value_field()
        .kind()
        .as_message()
        .unwrap()
        .clone();
    let mut v = DynamicMessage::new(value_desc);
    v.set_field_by_name("number_value", PValue::F64(1.5));
    let mut extra = extra;
    extra.set_field_by_name(
        "fields",
        PValue::Map(
            [(MapKey::String("k".into()), PValue::Message(v))]
                .into_iter()
                .collect(),
        ),
    );
    m.set_field_by_name("extra", PValue::Message(extra));
    m.set_field_by_name(
        "tags",
        PValue::List(vec![PValue::String("x".into()), PValue::String("y".into())]),
    );
    m
}

#[test]
fn every_protobuf_type_maps_to_its_iceberg_type() {
    let schema = schema();
    let order = order_message(&schema);
    crate::decode::assert_columns(
        &order.columns,
        &[
            ("id", "long"),
            ("customer", "string"),
            ("total", "struct<currency: string, units: long>"),
            ("status", "string"),
            ("lines", "list<struct<sku: string, qty: int>>"),
            ("counts", "map<string, int>"),
            (
                "payment",
                "struct<card: string, transfer: struct<iban: string>>",
            ),
            ("placed_at", "timestamptz"),
            ("wait", "long"),
            ("coupon", "string"),
            ("priority", "int"),
            ("blob", "binary"),
            ("big", "decimal(20, 0)"),
            ("d", "double"),
            ("f", "float"),
            ("flag", "boolean"),
            ("s32", "int"),
            ("fx", "long"),
            ("extra", "string"),
            ("maybe", "int"),
            ("tags", "list<string>"),
        ],
        "`nothing` (google.protobuf.Empty) has no column",
    );
}

#[test]
fn values_become_the_documented_json() {
    let schema = schema();
    let order = order_message(&schema);
    let bytes = full_order(&order).encode_to_vec();
    assert_eq!(
        decode(&order, &bytes),
        json!({
            "id": 42, "customer": "hé \"q\"",
            "total": {"currency": "EUR", "units": -5},
            "status": "PAID",
            "lines": [{"sku": "a", "qty": 3}],
            "counts": {"a": 1, "b": 2},
            "payment": {"transfer": {"iban": "DE00"}},
            "placed_at": "2024-01-02T03:04:05.123456Z",
            "wait": 90_500_000,
            "coupon": "C1",
            "priority": 0,
            "blob": "00ff10",
            "big": "18446744073709551615",
            "d": "NaN", "f": 1.5, "flag": true, "s32": -7, "fx": 4_294_967_295_u32,
            "extra": "{\"k\":1.5}",
            "maybe": null,
            "tags": ["x", "y"]
        })
    );
}

#[test]
fn absent_fields_are_null_with_presence_and_defaults_without() {
    let schema = schema();
    let order = order_message(&schema);
    // An empty message: every field absent.
    assert_eq!(
        decode(&order, &[]),
        json!({
            "id": 0, "customer": "", "total": null, "status": "STATUS_UNSPECIFIED",
            "lines": [], "counts": {}, "payment": null, "placed_at": null, "wait": null,
            "coupon": null, "priority": null, "blob": "", "big": "0", "d": 0.0, "f": 0.0,
            "flag": false, "s32": 0, "fx": 0, "extra": null, "maybe": null, "tags": []
        })
    );
    // An enum value the schema does not know (open enums): its number.
    let mut m = DynamicMessage::new(order.descriptor.clone());
    m.set_field_by_name("status", PValue::EnumNumber(9));
    m.set_field_by_name("card", PValue::String("4111".into()));
    let got = decode(&order, &m.encode_to_vec());
    assert_eq!(got["status"], "9");
    assert_eq!(got["payment"], json!({"card": "4111"}));
}

#[test]
fn the_json_text_encodes_into_the_declared_columns() {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int32Type, Int64Type, TimestampMicrosecondType};

    let schema = schema();
    let order = order_message(&schema);
    let mut out = Vec::new();
    order
        .decode(&full_order(&order).encode_to_vec(), &mut out)
        .unwrap();
    let object = crate::record::json::JsonObject::parse(out.clone())
        .unwrap()
        .to_serde();
    let object = object.as_object().unwrap().clone();
    let mut tracker = crate::schema::SchemaTracker::new();
    tracker.declare(&order.columns);
    let batch = crate::batch::tests::encode(
        &mut tracker,
        |t| t.new_table_schema().unwrap(),
        &[Some(object)],
    )
    .unwrap();
    let col = |n: &str| batch.column_by_name(n).unwrap().clone();
    assert_eq!(col("id").as_primitive::<Int64Type>().value(0), 42);
    assert_eq!(col("s32").as_primitive::<Int32Type>().value(0), -7);
    assert_eq!(
        col("big").as_primitive::<Decimal128Type>().value(0),
        u64::MAX as i128
    );
    assert_eq!(
        col("placed_at")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_704_164_645_123_456
    );
    assert_eq!(col("wait").as_primitive::<Int64Type>().value(0), 90_500_000);
    assert!(col("maybe").is_null(0));
}

#[test]
fn message_indexes_follow_the_confluent_encoding() {
    let split =
        |b: &[u8]| split_message_indexes(b).map(|(i, rest)| (i.as_slice().to_vec(), rest.to_vec()));
    // The single byte 0 stands for [0].
    assert_eq!(split(&[0, 8, 1]).unwrap(), (vec![0], vec![8, 1]));
    // [1]: count 1 (zig-zag 2), index 1 (zig-zag 2).
    assert_eq!(split(&[2, 2, 9]).unwrap(), (vec![1], vec![9]));
    // [0, 2]: count 2 (4), 0 (0), 2 (4).
    assert_eq!(split(&[4, 0, 4]).unwrap(), (vec![0, 2], vec![]));
    // A negative count (zig-zag 1 = -1), a negative index, a count past the limit,
    // and a list cut short are errors.
    for bad in [&[1u8][..], &[2, 1], &[0x80, 0x01], &[4, 0], &[0xff]] {
        let e = split(bad).unwrap_err().to_string();
        assert!(e.contains("message indexes"), "{bad:?}: {e}");
    }
    let schema = schema();
    assert_eq!(schema.message(&[1]).unwrap().full_name(), "shop.Other");
    let line = (0..3)
        .map(|i| schema.message(&[0, i]).unwrap().full_name().to_string())
        .collect::<Vec<_>>();
    assert!(line.contains(&"shop.Order.Line".to_string()), "{line:?}");
    let e = schema.message(&[5]).unwrap_err().to_string();
    assert!(e.contains("names no message of schema id 7"), "{e}");
}

#[test]
fn serialized_descriptors_from_the_registry_are_read_too() {
    // What confluent-kafka's Python serializer registers: base64 FileDescriptorProtos.
    let text = schema();
    let pool = text.file.parent_pool();
    let b64 = |name: &str| {
        base64::engine::general_purpose::STANDARD.encode(
            pool.get_file_by_name(name)
                .unwrap()
                .file_descriptor_proto()
                .encode_to_vec(),
        )
    };
    let main = b64(text.file.name());
    let serialized = ProtoSchema::from_registry(
        8,
        &main,
        &[("shop/common.proto".into(), b64("shop/common.proto"))],
    )
    .unwrap();
    let order = order_message(&serialized);
    assert_eq!(order.columns, order_message(&text).columns);
    let bytes = full_order(&order_message(&text)).encode_to_vec();
    assert_eq!(decode(&order, &bytes)["status"], "PAID");
}

#[test]
fn unusable_schemas_are_rejected_with_the_reason() {
    let e = ProtoSchema::from_registry(3, ORDER, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("id 3") && e.contains("shop/common.proto"), "{e}");
    let e = ProtoSchema::from_registry(4, "message {", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("id 4: Protobuf schema does not parse"), "{e}");
    // A recursive message is rejected when it is used, not when the file loads.
    let tree = ProtoSchema::from_registry(
        5,
        r#"syntax = "proto3";
        message Node { repeated Node children = 1; }
        message Flat { string name = 1; }"#,
        &[],
    )
    .unwrap();
    let e = tree.message(&[0]).unwrap_err().to_string();
    assert!(e.contains("recursive Protobuf message `Node`"), "{e}");
    assert!(tree.message(&[1]).is_ok());
}

#[test]
fn plain_schemas_load_from_a_proto_file_or_a_descriptor_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("shop")).unwrap();
    std::fs::write(dir.path().join("shop/common.proto"), COMMON).unwrap();
    std::fs::write(dir.path().join("order.proto"), ORDER).unwrap();
    let pool = load_pool(&ProtoSource::ProtoFile {
        path: dir.path().join("order.proto"),
        import_paths: vec![],
    })
    .unwrap();
    let order = plain_message(&pool, ".shop.Order").unwrap();
    assert_eq!(order.columns.fields().len(), 21);
    let e = plain_message(&pool, "shop.Nope").unwrap_err().to_string();
    assert!(
        e.contains("no message `shop.Nope`") && e.contains("shop.Order"),
        "{e}"
    );

    let set = dir.path().join("order.desc");
    std::fs::write(&set, pool.encode_to_vec()).unwrap();
    let from_set = load_pool(&ProtoSource::DescriptorSet(set)).unwrap();
    assert_eq!(
        plain_message(&from_set, "shop.Order").unwrap().columns,
        order.columns
    );
    let e = load_pool(&ProtoSource::DescriptorSet(dir.path().join("order.proto")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a FileDescriptorSet"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Fuzz: arbitrary bytes never panic the index parser or the decoder.
    #[test]
    fn fuzz_protobuf_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let schema = schema();
        let order = order_message(&schema);
        let _ = split_message_indexes(&bytes);
        let _ = order.decode(&bytes, &mut Vec::new());
    }

    /// Fuzz: a valid message with one byte flipped never panics either.
    #[test]
    fn fuzz_corrupted_protobuf_never_panics(at in any::<prop::sample::Index>(), xor in 1u8..) {
        let schema = schema();
        let order = order_message(&schema);
        let mut bytes = full_order(&order).encode_to_vec();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        let _ = order.decode(&bytes, &mut Vec::new());
    }
}
