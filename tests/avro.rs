//! Avro in the Confluent wire format, produced by confluent-kafka's real `AvroSerializer`
//! against the registry fixture: schema v1, then v2 with a new top-level field and a new
//! field inside list elements. Both readers see every row with the exact Avro types.

use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, Registry, Transform, Workspace, spawn_agent};
use serde_json::{Value, json};

const V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "long"},
  {"name": "customer", "type": "string"},
  {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
  {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "day", "type": {"type": "int", "logicalType": "date"}},
  {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "qty", "type": "int"}]}}},
  {"name": "attrs", "type": {"type": "map", "values": "string"}}
]}"#;

/// v1 plus `coupon` and a `discount` inside every line (both optional, default null).
fn v2() -> String {
    V1.replace(
        r#"{"name": "qty", "type": "int"}]}}},"#,
        r#"{"name": "qty", "type": "int"},
    {"name": "discount", "type": ["null", "double"], "default": null}]}}},"#,
    )
    .replace(
        r#"{"name": "attrs", "type": {"type": "map", "values": "string"}}"#,
        r#"{"name": "attrs", "type": {"type": "map", "values": "string"}},
  {"name": "coupon", "type": ["null", "string"], "default": null}"#,
    )
}

fn order(id: i64, v2: bool) -> Value {
    let mut line = json!({"sku": format!("sku-{id}"), "qty": id as i32});
    let mut o = json!({
        "id": id,
        "customer": format!("c{id}"),
        "amount": format!("{id}.25"),
        "placed_at": format!("2024-01-0{id}T03:04:05.123Z"),
        "day": format!("2024-02-0{id}"),
        "ref": format!("00000000-0000-4000-8000-00000000000{id}"),
        "status": if id % 2 == 0 { "PAID" } else { "NEW" },
        "attrs": {"k": format!("v{id}")},
    });
    if v2 {
        line["discount"] = json!(0.5);
        o["coupon"] = json!(format!("C{id}"));
    }
    o["lines"] = json!([line]);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_v1_then_v2_lands_with_exact_types_and_both_readers_see_it() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(Some("floe:s3cret"))?;
    registry.produce_avro(
        &broker.bootstrap,
        "orders",
        V1,
        &[order(1, false), order(2, false), order(3, false)],
    )?;

    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("shop", "orders")
                .format("avro")
                .registry(&registry.url)
                .set("decode.registry.username", "floe")
                .set("decode.registry.password", "s3cret"),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 3, Duration::from_secs(60))
        .await?;
    // Not Avro / an id the registry does not know: dead-lettered with their bytes.
    // (Before v2, so that v2's commit proves they were handled.)
    let unknown_id = vec![0u8, 0, 0, 0, 99, 2, 0];
    let not_framed = b"{\"id\": 6}".to_vec();
    broker
        .produce(
            "orders",
            &[
                (None, Some(unknown_id.clone())),
                (None, Some(not_framed.clone())),
            ],
        )
        .await?;
    registry.produce_avro(
        &broker.bootstrap,
        "orders",
        &v2(),
        &[order(4, true), order(5, true)],
    )?;
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
            ("amount", "decimal(10, 2)"),
            ("placed_at", "timestamptz"),
            ("day", "date"),
            ("ref", "uuid"),
            ("status", "string"),
            (
                "lines",
                "list<struct<sku: string, qty: int, discount: double>>",
            ),
            ("attrs", "map<string, string>"),
            ("coupon", "string"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(
            types, expect,
            "{reader}: column types come from the Avro schema"
        );

        let rows = dump.rows();
        assert_eq!(rows.len(), 5, "{reader}");
        let r1 = &rows[0];
        assert_eq!(r1["id"], 1, "{reader}");
        assert_eq!(r1["amount"], "1.25", "{reader}");
        assert_eq!(
            r1["placed_at"], "2024-01-01T03:04:05.123000+00:00",
            "{reader}"
        );
        assert_eq!(r1["day"], "2024-02-01", "{reader}");
        assert_eq!(
            r1["ref"], "00000000-0000-4000-8000-000000000001",
            "{reader}"
        );
        assert_eq!(r1["status"], "NEW", "{reader}");
        assert_eq!(
            r1["attrs"],
            json!([{"key": "k", "value": "v1"}]),
            "{reader}"
        );
        assert_eq!(
            r1["lines"],
            json!([{"sku": "sku-1", "qty": 1, "discount": null}]),
            "{reader}: v1 rows read the new nested field as null"
        );
        assert_eq!(r1["coupon"], Value::Null, "{reader}: v1 rows read null");
        let r4 = &rows[3];
        assert_eq!(r4["coupon"], "C4", "{reader}");
        assert_eq!(
            r4["lines"],
            json!([{"sku": "sku-4", "qty": 4, "discount": 0.5}]),
            "{reader}"
        );
        assert_eq!(rows[4]["status"], "NEW", "{reader}");
        assert_eq!(rows[1]["status"], "PAID", "{reader}");
    }

    // Each schema id was fetched once (cache by id).
    assert_eq!(registry.schema_gets()?, json!({"1": 1, "2": 1, "99": 1}));

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
    assert_eq!(got[0].0, unknown_id);
    assert!(
        got[0]
            .1
            .contains("schema id 99 is unknown to the schema registry"),
        "{}",
        got[0].1
    );
    assert_eq!(got[1].0, not_framed);
    assert!(got[1].1.contains("magic byte"), "{}", got[1].1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_registry_is_retried_and_nothing_is_lost() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let port = floe_tests::free_port();
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("shop", "orders")
                .format("avro")
                .registry(&format!("http://127.0.0.1:{port}"))
                .set("decode.registry.timeout", "2s"),
        ),
    )?;
    // Records produced through a registry that then goes away.
    let first = Registry::start_on(port, None)?;
    first.produce_avro(
        &broker.bootstrap,
        "orders",
        V1,
        &[order(1, false), order(2, false)],
    )?;
    drop(first);
    let agent = spawn_agent(&config)?;
    // The registry is unreachable: a transient failure, retried; nothing is
    // dead-lettered, nothing committed, the agent keeps running.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson")).map_or(true, |l| l.is_empty())
    );
    assert_eq!(ws.committed_rows("shop", "orders").await?, 0);
    // It comes back (same schema, same id) and answers at the old address: the records land.
    let second = Registry::start(None)?;
    second.produce_avro(&broker.bootstrap, "orders", V1, &[order(3, false)])?;
    let _forward = forward(port, second.url.trim_start_matches("http://"))?;
    ws.wait_for_rows("shop", "orders", 3, Duration::from_secs(90))
        .await?;
    agent.stop().await?;
    assert!(
        DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson")).map_or(true, |l| l.is_empty())
    );
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "shop", "orders", "id")?;
        assert_eq!(dump.rows().len(), 3, "{reader}");
    }
    Ok(())
}

/// With plugins, the Avro types are hints: fields that pass through keep their exact
/// type, a field a plugin drops gets no column. Keys are Avro too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_see_avro_as_json_and_unchanged_fields_keep_their_avro_types() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    let registry = Registry::start(None)?;
    registry.produce_avro_keyed(
        &broker.bootstrap,
        "orders",
        V1,
        &[order(1, false), order(2, false)],
        Some((r#""string""#, "customer")),
    )?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("shop", "orders")
                .format("avro")
                .key_format("avro")
                .registry(&registry.url)
                .transform(
                    Transform::new(floe_tests::plugin_path("redact"))
                        .with(json!({"drop": ["customer"]})),
                ),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("shop", "orders", 2, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    let dump = ws.read("duckdb", "shop", "orders", "id")?;
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
            json!(["amount", "decimal(10, 2)"]),
            json!(["placed_at", "timestamptz"]),
            json!(["day", "date"]),
            json!(["ref", "uuid"]),
            json!(["status", "string"]),
            json!(["lines", "list<struct<sku: string, qty: int>>"]),
            json!(["attrs", "map<string, string>"]),
        ]
    );
    assert_eq!(dump.rows()[1]["amount"], "2.25");
    // Avro keys are decoded with the registry too (a string key is stored as is).
    assert_eq!(dump.rows()[1]["_kafka_key"], "c2");
    assert_eq!(
        dump.rows()[1]["ref"],
        "00000000-0000-4000-8000-000000000002"
    );
    Ok(())
}

/// Accepts connections on `127.0.0.1:port` and relays them to `to` (the registry back at
/// its old address), for the rest of the test process.
fn forward(port: u16, to: &str) -> Result<std::thread::JoinHandle<()>> {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let to = to.to_string();
    Ok(std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(&to) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut c, mut s) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    }))
}
