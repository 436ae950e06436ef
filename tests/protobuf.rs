//! Protobuf in the Confluent wire format, produced by confluent-kafka's real
//! `ProtobufSerializer` against the registry fixture: a schema importing another file
//! (registered as its own subject and referenced) and the well-known types, keys as
//! Protobuf messages, then a v2 that adds a field inside the list elements. Both readers
//! see every row with the exact types. Also plain Protobuf with a `.proto` file.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, Produce, Registry, Workspace, spawn_agent};
use serde_json::{Value, json};

const COMMON: &str = r#"syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
enum Status { STATUS_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
"#;

const ORDER_V1: &str = r#"syntax = "proto3";
package shop;
import "shop/common.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

message Order {
  int64 id = 1;
  string customer = 2;
  shop.common.Money total = 3;
  shop.common.Status status = 4;
  repeated Line lines = 5;
  map<string, string> attrs = 6;
  oneof payment { string card = 7; Transfer transfer = 8; }
  google.protobuf.Timestamp placed_at = 9;
  google.protobuf.Duration wait = 10;
  google.protobuf.StringValue coupon = 11;
  optional int32 priority = 12;
  bytes blob = 13;
  uint64 big = 14;
  message Line { string sku = 1; int32 qty = 2; }
  message Transfer { string iban = 1; }
}

message OrderKey { int64 id = 1; string region = 2; }
"#;

/// v1 plus a `discount` inside every line.
fn order_v2() -> String {
    ORDER_V1.replace(
        "message Line { string sku = 1; int32 qty = 2; }",
        "message Line { string sku = 1; int32 qty = 2; optional double discount = 3; }",
    )
}

/// Writes the .proto files of one schema version into `dir`.
fn write_protos(dir: &Path, order: &str) -> Result<()> {
    std::fs::create_dir_all(dir.join("shop"))?;
    std::fs::write(dir.join("shop/common.proto"), COMMON)?;
    std::fs::write(dir.join("shop/order.proto"), order)?;
    Ok(())
}

/// An order in the protobuf JSON mapping, with its key in `_key`.
fn order(id: i64, v2: bool) -> Value {
    let mut line = json!({"sku": format!("sku-{id}"), "qty": id});
    if v2 {
        line["discount"] = json!(0.5);
    }
    let mut o = json!({
        "_key": {"id": id, "region": "eu"},
        "id": id,
        "customer": format!("c{id}"),
        "total": {"currency": "EUR", "units": id * 100},
        "status": if id % 2 == 0 { "PAID" } else { "NEW" },
        "lines": [line],
        "attrs": {"k": format!("v{id}")},
        "placedAt": format!("2024-01-0{id}T03:04:05.123456Z"),
        "wait": "1.5s",
        "blob": B64.encode([0u8, 255, id as u8]),
        "big": "18446744073709551615",
    });
    if id % 2 == 0 {
        o["card"] = json!("4111");
        o["coupon"] = json!(format!("C{id}"));
    } else {
        o["transfer"] = json!({"iban": "DE00"});
        o["priority"] = json!(0);
    }
    o
}

fn types(dump: &Value) -> Vec<(String, String)> {
    dump["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c[0].as_str().unwrap().into(), c[1].as_str().unwrap().into()))
        .filter(|(n, _): &(String, String)| !n.starts_with("_kafka"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_v1_then_v2_with_references_keys_and_well_known_types() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(Some("floe:s3cret"))?;
    let protos = tempfile::tempdir()?;
    write_protos(protos.path(), ORDER_V1)?;
    let schema = protos.path().join("shop/order.proto");
    let produce = |records: &[Value], schema: &Path| {
        registry.produce(
            &broker.bootstrap,
            "orders",
            &Produce {
                format: "protobuf",
                schema,
                proto_path: schema.parent().and_then(Path::parent),
                records,
                message: Some("shop.Order"),
                key_field: Some("_key"),
                key_schema: Some(schema),
                key_message: Some("shop.OrderKey"),
                ..Produce::default()
            },
        )
    };
    produce(
        &[order(1, false), order(2, false), order(3, false)],
        &schema,
    )?;

    let ws = Workspace::new()?;
    // Credentials in the URL: used as basic auth, never shown.
    let url = registry.url.replacen("http://", "http://floe:s3cret@", 1);
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("shop", "orders")
                .format("protobuf")
                .key_format("protobuf")
                .registry(&url),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 3, Duration::from_secs(60))
        .await?;
    // Malformed: an unknown id, a known id with a body that is not the message, no header.
    let unknown_id = vec![0u8, 0, 0, 0, 99, 0, 8, 1];
    let garbage = vec![0u8, 0, 0, 0, 2, 0, 0xff, 0xff, 0xff];
    let not_framed = b"{\"id\": 6}".to_vec();
    broker
        .produce(
            "orders",
            &[
                (None, Some(unknown_id.clone())),
                (None, Some(garbage.clone())),
                (None, Some(not_framed.clone())),
            ],
        )
        .await?;
    let protos_v2 = tempfile::tempdir()?;
    write_protos(protos_v2.path(), &order_v2())?;
    produce(
        &[order(4, true), order(5, true)],
        &protos_v2.path().join("shop/order.proto"),
    )?;
    ws.wait_for_rows("shop", "orders", 5, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "shop", "orders", "id")?;
        let expect: Vec<(String, String)> = [
            ("id", "long"),
            ("customer", "string"),
            ("total", "struct<currency: string, units: long>"),
            ("status", "string"),
            (
                "lines",
                "list<struct<sku: string, qty: int, discount: double>>",
            ),
            ("attrs", "map<string, string>"),
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
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(
            types(&dump.0),
            expect,
            "{reader}: column types come from the Protobuf schema"
        );
        let rows = dump.rows();
        assert_eq!(rows.len(), 5, "{reader}");
        let r1 = &rows[0];
        assert_eq!(
            r1["_kafka_key"], r#"{"id":1,"region":"eu"}"#,
            "{reader}: keys are decoded with their own message type"
        );
        assert_eq!(r1["id"], 1, "{reader}");
        assert_eq!(
            r1["total"],
            json!({"currency": "EUR", "units": 100}),
            "{reader}"
        );
        assert_eq!(r1["status"], "NEW", "{reader}");
        assert_eq!(
            r1["lines"],
            json!([{"sku": "sku-1", "qty": 1, "discount": null}]),
            "{reader}: v1 rows read the new nested field as null"
        );
        assert_eq!(
            r1["attrs"],
            json!([{"key": "k", "value": "v1"}]),
            "{reader}"
        );
        assert_eq!(
            r1["payment"],
            json!({"card": null, "transfer": {"iban": "DE00"}}),
            "{reader}"
        );
        assert_eq!(
            r1["placed_at"], "2024-01-01T03:04:05.123456+00:00",
            "{reader}"
        );
        assert_eq!(r1["wait"], 1_500_000, "{reader}: microseconds");
        assert_eq!(
            r1["coupon"],
            Value::Null,
            "{reader}: an absent wrapper is null"
        );
        assert_eq!(
            r1["priority"], 0,
            "{reader}: proto3 optional keeps an explicit zero"
        );
        assert_eq!(r1["blob"], json!({"hex": "00ff01"}), "{reader}");
        assert_eq!(r1["big"], "18446744073709551615", "{reader}");
        let r2 = &rows[1];
        assert_eq!(r2["status"], "PAID", "{reader}");
        assert_eq!(r2["coupon"], "C2", "{reader}");
        assert_eq!(
            r2["priority"],
            Value::Null,
            "{reader}: absent optional is null"
        );
        assert_eq!(
            r2["payment"],
            json!({"card": "4111", "transfer": null}),
            "{reader}"
        );
        assert_eq!(
            rows[3]["lines"],
            json!([{"sku": "sku-4", "qty": 4, "discount": 0.5}]),
            "{reader}"
        );
    }

    // The imported file was fetched once as a referenced subject version.
    let stats = registry.stats()?;
    assert_eq!(stats["version_gets"]["shop/common.proto/1"], 1, "{stats}");

    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    let got: Vec<(Vec<u8>, &str)> = letters
        .iter()
        .map(|l| {
            (
                B64.decode(l.value_base64.as_deref().unwrap_or_default())
                    .unwrap(),
                l.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].0, unknown_id);
    assert!(
        got[0].1.contains(&format!(
            "schema id 99 is unknown to the schema registry at {}",
            registry.url
        )),
        "{}",
        got[0].1
    );
    assert_eq!(got[1].0, garbage);
    assert!(
        got[1].1.contains("value is not valid Protobuf"),
        "{}",
        got[1].1
    );
    assert_eq!(got[2].0, not_framed);
    assert!(got[2].1.contains("magic byte"), "{}", got[2].1);
    for (_, reason) in &got {
        assert!(!reason.contains("s3cret"), "{reason}");
    }
    Ok(())
}

/// Plain Protobuf (no header) with a `.proto` file and an import directory from config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_protobuf_from_a_proto_file() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(None)?;
    let protos = tempfile::tempdir()?;
    write_protos(protos.path(), ORDER_V1)?;
    let schema = protos.path().join("shop/order.proto");
    let mut records = vec![order(1, false), order(2, false)];
    for r in &mut records {
        r.as_object_mut().unwrap().remove("_key");
    }
    registry.produce(
        &broker.bootstrap,
        "orders",
        &Produce {
            format: "protobuf",
            schema: &schema,
            records: &records,
            proto_path: Some(protos.path()),
            message: Some("shop.Order"),
            plain: true,
            ..Produce::default()
        },
    )?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("shop", "orders")
                .format("protobuf")
                .schema_file(&schema)
                .set(
                    "decode.import_paths",
                    vec![protos.path().display().to_string()],
                )
                .set("decode.message", "shop.Order"),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 2, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    let dump = ws.read("duckdb", "shop", "orders", "id")?;
    assert_eq!(types(&dump.0).len(), 13);
    let rows = dump.rows();
    assert_eq!(rows[1]["customer"], "c2");
    assert_eq!(rows[1]["placed_at"], "2024-01-02T03:04:05.123456+00:00");
    assert_eq!(rows[1]["lines"], json!([{"sku": "sku-2", "qty": 2}]));
    Ok(())
}
