//! JSON Schema in the Confluent wire format, produced by confluent-kafka's real
//! `JSONSerializer` against the registry fixture: columns and types come from the schema
//! (which references another subject), keys are JSON Schema too, a v2 adds a field
//! inside the list elements, and a message that violates its schema follows
//! `on_incompatible`. Also Avro with a schema reference to another subject.

use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, Pipeline, Produce, Registry, Workspace, spawn_agent};
use serde_json::{Value, json};

const ADDRESS: &str = r#"{
  "type": "object",
  "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
  "required": ["street"]
}"#;

const ORDER_V1: &str = r##"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Order",
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "customer": {"type": "string"},
    "amount": {"type": "number"},
    "paid": {"type": "boolean"},
    "placed_at": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"},
    "note": {"oneOf": [{"type": "null", "title": "Not included"}, {"type": "string"}]},
    "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
    "attrs": {"type": "object", "additionalProperties": {"type": "string"}},
    "address": {"$ref": "address.json"}
  },
  "required": ["id", "customer"],
  "definitions": {
    "Line": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}
  }
}"##;

const KEY: &str =
    r#"{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}"#;

/// v1 plus a `discount` inside every line.
fn order_v2() -> String {
    ORDER_V1.replace(
        r#""qty": {"type": "integer"}}"#,
        r#""qty": {"type": "integer"}, "discount": {"type": "number"}}"#,
    )
}

fn order(id: i64, v2: bool) -> Value {
    let mut line = json!({"sku": format!("sku-{id}"), "qty": id});
    if v2 {
        line["discount"] = json!(0.5);
    }
    json!({
        "_key": {"id": id},
        "id": id,
        "customer": format!("c{id}"),
        "amount": id as f64 + 0.25,
        "paid": id % 2 == 0,
        "placed_at": format!("2024-01-0{id}T05:04:05.123+02:00"),
        "day": format!("2024-02-0{id}"),
        "note": if id == 1 { Value::Null } else { json!(format!("n{id}")) },
        "lines": [line],
        "attrs": {"k": format!("v{id}")},
        "address": {"street": format!("Main {id}")},
    })
}

/// The pipeline `orders`: topic `orders` into `shop.orders`, a commit every second.
fn orders(ws: &Workspace, bootstrap: &str) -> Pipeline {
    ws.pipeline("orders", bootstrap, "orders")
        .table("shop", "orders")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_v1_then_v2_with_a_reference_keys_and_invalid_messages() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(None)?;
    let files = tempfile::tempdir()?;
    let write = |name: &str, text: &str| -> Result<std::path::PathBuf> {
        let p = files.path().join(name);
        std::fs::write(&p, text)?;
        Ok(p)
    };
    let address = write("address.json", ADDRESS)?;
    let v1 = write("order-v1.json", ORDER_V1)?;
    let v2 = write("order-v2.json", &order_v2())?;
    let key = write("key.json", KEY)?;
    let references = [("address.json", "address", address.as_path())];
    let produce = |records: &[Value], schema: &std::path::Path| {
        registry.produce(
            &broker.bootstrap,
            "orders",
            &Produce {
                format: "json",
                schema,
                records,
                references: &references,
                key_field: Some("_key"),
                key_schema: Some(&key),
                ..Produce::default()
            },
        )
    };
    produce(&[order(1, false), order(2, false), order(3, false)], &v1)?;

    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            orders(&ws, &broker.bootstrap)
                .format("json_schema")
                .key_format("json_schema")
                .registry(&registry.url),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 3, Duration::from_secs(60))
        .await?;
    let v1_id = registry.get("/subjects/orders-value/versions/1")?["id"]
        .as_u64()
        .unwrap() as u32;
    let frame = |id: u32, body: &[u8]| {
        let mut m = vec![0u8];
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(body);
        m
    };
    // Valid JSON that violates the schema (id is a string), and JSON that is not JSON.
    let violating = frame(v1_id, br#"{"id": "six", "customer": "c6"}"#);
    let not_json = frame(v1_id, b"{not json");
    broker
        .produce(
            "orders",
            &[
                (None, Some(violating.clone())),
                (None, Some(not_json.clone())),
            ],
        )
        .await?;
    produce(&[order(4, true), order(5, true)], &v2)?;
    ws.wait_for_rows("shop", "orders", 5, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "shop", "orders", "id")?;
        let types: Vec<(String, String)> = dump.0["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c[0].as_str().unwrap().into(), c[1].as_str().unwrap().into()))
            .filter(|(n, _): &(String, String)| !n.starts_with("_kafka"))
            .collect();
        let expect: Vec<(String, String)> = [
            ("id", "long"),
            ("customer", "string"),
            ("amount", "double"),
            ("paid", "boolean"),
            ("placed_at", "timestamptz"),
            ("day", "date"),
            ("note", "string"),
            (
                "lines",
                "list<struct<sku: string, qty: long, discount: double>>",
            ),
            ("attrs", "map<string, string>"),
            ("address", "struct<street: string, zip: string>"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(
            types, expect,
            "{reader}: column types come from the JSON schema"
        );
        let rows = dump.rows();
        assert_eq!(rows.len(), 5, "{reader}");
        let r1 = &rows[0];
        assert_eq!(r1["_kafka_key"], r#"{"id":1}"#, "{reader}");
        assert_eq!(r1["amount"], 1.25, "{reader}");
        assert_eq!(r1["paid"], false, "{reader}");
        assert_eq!(
            r1["placed_at"], "2024-01-01T03:04:05.123000+00:00",
            "{reader}: normalized to UTC"
        );
        assert_eq!(r1["day"], "2024-02-01", "{reader}");
        assert_eq!(r1["note"], Value::Null, "{reader}");
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
            r1["address"],
            json!({"street": "Main 1", "zip": null}),
            "{reader}: the referenced schema's columns"
        );
        assert_eq!(rows[1]["note"], "n2", "{reader}");
        assert_eq!(
            rows[3]["lines"],
            json!([{"sku": "sku-4", "qty": 4, "discount": 0.5}]),
            "{reader}"
        );
    }
    let stats = registry.stats()?;
    assert_eq!(stats["version_gets"]["address/1"], 1, "{stats}");

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
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, violating);
    assert!(
        got[0].1.starts_with(&format!(
            "value does not match its JSON schema (id {v1_id}): at /id:"
        )),
        "{}",
        got[0].1
    );
    assert_eq!(got[1].0, not_json);
    assert!(got[1].1.contains("value is not valid JSON"), "{}", got[1].1);
    Ok(())
}

/// `on_incompatible = "fail"`: a message that violates its schema stops the pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_violation_stops_the_pipeline_when_the_policy_is_fail() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let files = tempfile::tempdir()?;
    let schema = files.path().join("order.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"id": {"type": "integer"}}}"#,
    )?;
    // Plain JSON validated by a schema file (no registry, no header).
    broker
        .produce(
            "orders",
            &[
                (None, Some(br#"{"id": "one"}"#.to_vec())),
                (None, Some(br#"{"id": 2}"#.to_vec())),
            ],
        )
        .await?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            orders(&ws, &broker.bootstrap)
                .format("json_schema")
                .schema_file(&schema)
                .schema("on_incompatible", "fail"),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    let error = agent
        .finished(Duration::from_secs(60))
        .await?
        .expect_err("the pipeline stops");
    let message = error.to_string();
    assert!(
        message.contains("value does not match its JSON schema: at /id:")
            && message.contains("(on_incompatible = \"fail\")"),
        "{message}"
    );
    assert_eq!(ws.committed_rows("shop", "orders").await?, 0);
    Ok(())
}

const ADDRESS_AVSC: &str = r#"{"type": "record", "name": "Address", "namespace": "shop", "fields": [
  {"name": "street", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": null}]}"#;

const ORDER_AVSC: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "long"},
  {"name": "ship_to", "type": "shop.Address"},
  {"name": "bill_to", "type": ["null", "shop.Address"], "default": null}]}"#;

/// Avro schemas that use a named type registered under another subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_with_a_reference_to_another_subject() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(None)?;
    let files = tempfile::tempdir()?;
    let address = files.path().join("address.avsc");
    std::fs::write(&address, ADDRESS_AVSC)?;
    let order = files.path().join("order.avsc");
    std::fs::write(&order, ORDER_AVSC)?;
    registry.produce(
        &broker.bootstrap,
        "orders",
        &Produce {
            format: "avro",
            schema: &order,
            records: &[
                json!({"id": 1, "ship_to": {"street": "Main 1", "zip": null}, "bill_to": null}),
                json!({"id": 2, "ship_to": {"street": "Main 2", "zip": "10115"},
                       "bill_to": {"street": "Side 2", "zip": null}}),
            ],
            references: &[("shop.Address", "address", &address)],
            ..Produce::default()
        },
    )?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            orders(&ws, &broker.bootstrap)
                .format("avro")
                .registry(&registry.url),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 2, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "shop", "orders", "id")?;
        let columns: Vec<Value> = dump.0["columns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c[0].as_str().unwrap().starts_with("_kafka"))
            .cloned()
            .collect();
        assert_eq!(
            columns,
            vec![
                json!(["id", "long"]),
                json!(["ship_to", "struct<street: string, zip: string>"]),
                json!(["bill_to", "struct<street: string, zip: string>"]),
            ],
            "{reader}"
        );
        let rows = dump.rows();
        assert_eq!(rows[0]["bill_to"], Value::Null, "{reader}");
        assert_eq!(
            rows[1]["ship_to"],
            json!({"street": "Main 2", "zip": "10115"}),
            "{reader}"
        );
        assert_eq!(
            rows[1]["bill_to"],
            json!({"street": "Side 2", "zip": null}),
            "{reader}"
        );
    }
    assert_eq!(registry.stats()?["version_gets"]["address/1"], 1);
    Ok(())
}
