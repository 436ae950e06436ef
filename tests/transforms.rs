//! The WebAssembly transform chain end to end: a real broker, plugins built to
//! `wasm32-wasip2`, routed tables read back by PyIceberg and DuckDB, every shipped
//! plugin (rename, flatten, timestamp, the flat-map explode...), error policies, and
//! faults that cannot be pinned on one record (tests/sandbox.rs has the ones that can).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, Message, Pipeline, Transform, Workspace, plugin_path, spawn_agent};
use serde_json::{Value, json};

const REGIONS: [&str; 3] = ["eu", "us", "apac"];

fn event(i: i64) -> Value {
    let region = REGIONS[(i % 3) as usize];
    let mut v = json!({
        "id": i,
        "user": format!("user-{}", i % 50),
        "email": format!("u{i}@example.com"),
        "region": region,
        "paid": i % 2 == 0,
        "amount": i as f64 + 0.5,
    });
    match region {
        "eu" => v["vat_rate"] = json!(0.2),
        "us" => v["state"] = json!("CA"),
        _ => {}
    }
    v
}

fn messages(values: impl Iterator<Item = Value>) -> Vec<Message> {
    values
        .map(|v| (None, Some(v.to_string().into_bytes())))
        .collect()
}

/// A broker holding `values` in `topic` (two partitions), and a pipeline reading it
/// into `wasm.TOPIC`, to add transforms to.
async fn setup(
    topic: &str,
    values: impl Iterator<Item = Value>,
) -> Result<(Broker, Workspace, Pipeline)> {
    setup_on(topic, 2, values).await
}

/// [`setup`] with a topic of `partitions` partitions.
async fn setup_on(
    topic: &str,
    partitions: i32,
    values: impl Iterator<Item = Value>,
) -> Result<(Broker, Workspace, Pipeline)> {
    let broker = Broker::start()?;
    broker.create_topic(topic, partitions).await?;
    broker.produce(topic, &messages(values)).await?;
    let ws = Workspace::new()?;
    let pipeline = ws
        .pipeline(topic, &broker.bootstrap, topic)
        .table("wasm", topic)
        .commit_interval("1s");
    Ok((broker, ws, pipeline))
}

/// The shipped plugin `name` with its settings.
fn plugin(name: &str, with: Value) -> Transform {
    Transform::new(plugin_path(name)).with(with)
}

/// The faulty test plugin, named `faulty`, with its settings.
fn faulty(with: Value) -> Transform {
    Transform::new(plugin_path("test-faulty"))
        .name("faulty")
        .with(with)
}

fn ids(rows: &[Value]) -> BTreeSet<i64> {
    rows.iter().map(|r| r["id"].as_i64().expect("id")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_redact_route_chain_writes_one_table_per_stream() -> Result<()> {
    const N: i64 = 600;
    let (_broker, ws, pipeline) = setup("events", (0..N).map(event)).await?;
    // Two plugin threads whatever the machine's default (one less than its cores): a
    // batch of N records is two parts, run on both.
    let config = ws.write(
        &ws.config().pipeline(
            pipeline
                .transform_threads(2)
                .stream("eu", "events_eu")
                .stream("us", "events_us")
                .transform(plugin(
                    "filter",
                    json!({"all": [{"field": "paid", "op": "eq", "value": true}]}),
                ))
                .transform(plugin(
                    "redact",
                    json!({"drop": ["email"], "hash": ["user"], "salt": "pepper"}),
                ))
                .transform(plugin(
                    "route",
                    json!({"field": "region", "routes": {"eu": "eu", "us": "us"}}),
                )),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    for table in ["events", "events_eu", "events_us"] {
        ws.wait_for_rows("wasm", table, 100, Duration::from_secs(120))
            .await?;
    }
    agent.stop().await?;

    let expected = |region: usize| -> BTreeSet<i64> {
        (0..N)
            .filter(|i| i % 2 == 0 && (i % 3) as usize == region)
            .collect()
    };
    for reader in ["pyiceberg", "duckdb"] {
        let eu = ws.read(reader, "wasm", "events_eu", "id")?;
        let us = ws.read(reader, "wasm", "events_us", "id")?;
        let rest = ws.read(reader, "wasm", "events", "id")?;
        assert_eq!(
            ids(eu.rows()),
            expected(0),
            "{reader}: eu table holds the paid EU events"
        );
        assert_eq!(
            ids(us.rows()),
            expected(1),
            "{reader}: us table holds the paid US events"
        );
        assert_eq!(
            ids(rest.rows()),
            expected(2),
            "{reader}: unrouted events stay in the default table"
        );
        // Each table's schema is inferred from its own records.
        assert!(
            eu.columns().contains(&"vat_rate".to_string())
                && !eu.columns().contains(&"state".to_string()),
            "{reader}: {:?}",
            eu.columns()
        );
        assert!(
            us.columns().contains(&"state".to_string())
                && !us.columns().contains(&"vat_rate".to_string()),
            "{reader}: {:?}",
            us.columns()
        );
        for dump in [&eu, &us, &rest] {
            assert!(
                !dump.columns().contains(&"email".to_string()),
                "{reader}: email was dropped"
            );
            for row in dump.rows() {
                let user = row["user"].as_str().expect("user");
                assert_eq!(
                    user.len(),
                    64,
                    "{reader}: user is a SHA-256 hex digest: {user}"
                );
                assert!(user.chars().all(|c| c.is_ascii_hexdigit()));
                assert_eq!(
                    row["amount"],
                    json!(row["id"].as_i64().unwrap() as f64 + 0.5)
                );
            }
        }
    }
    Ok(())
}

/// Runs the faulty test plugin until `rows` rows are committed, then stops the agent.
async fn run_faulty(topic: &str, n: i64, faulty: Transform, rows: i64) -> Result<Workspace> {
    let (_broker, ws, pipeline) = setup(
        topic,
        (0..n).map(|i| json!({"id": i, "v": format!("x{i}")})),
    )
    .await?;
    let config = ws.write(&ws.config().pipeline(pipeline.transform(faulty)))?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("wasm", topic, rows, Duration::from_secs(90))
        .await?;
    agent.stop().await?;
    Ok(ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_error_dead_letters_exactly_that_record() -> Result<()> {
    const N: i64 = 3_000;
    let ws = run_faulty(
        "errors",
        N,
        faulty(json!({"mode": "fail_every", "every": 1000})),
        N - 3,
    )
    .await?;
    let rows = ws.read("pyiceberg", "wasm", "errors", "id")?;
    let expected: BTreeSet<i64> = (0..N).filter(|i| i % 1000 != 0).collect();
    assert_eq!(ids(rows.rows()), expected);
    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    let rejected: BTreeSet<i64> = letters
        .iter()
        .map(|l| {
            let v: Value =
                serde_json::from_slice(&B64.decode(l.value_base64.as_deref().unwrap()).unwrap())
                    .unwrap();
            v["id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(
        rejected,
        BTreeSet::from([0, 1000, 2000]),
        "exactly the rejected records, with their original bytes"
    );
    for l in &letters {
        assert_eq!(l.stage, "transform");
        assert!(
            l.reason
                .starts_with("plugin faulty: faulty: rejected record"),
            "{}",
            l.reason
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_policy_drops_and_fail_policy_stops() -> Result<()> {
    let ws = run_faulty(
        "dropped",
        2_000,
        faulty(json!({"mode": "fail_every", "every": 1000})).on_error("drop"),
        1_998,
    )
    .await?;
    assert_eq!(
        ws.read("duckdb", "wasm", "dropped", "id")?.rows().len(),
        1_998
    );
    assert!(
        !ws.path("dead-letter.ndjson").exists()
            || DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?.is_empty()
    );

    let err = stops_with(
        "failing",
        faulty(json!({"mode": "fail_every", "every": 1000})).on_error("fail"),
    )
    .await?;
    assert!(
        err.contains("plugin faulty failed on failing/")
            && err.contains("faulty: rejected record 0"),
        "{err}"
    );
    Ok(())
}

/// Runs a pipeline whose plugin makes it stop; returns the error text.
///
/// One partition: the record that stops the pipeline is its first, so no record
/// before it can be committed. (With two, the other partition's records may pass the
/// plugin and be committed at an interval before the failing batch arrives, which is
/// correct: its offsets are its own.)
async fn stops_with(topic: &str, faulty: Transform) -> Result<String> {
    let (_broker, ws, pipeline) = setup_on(topic, 1, (0..50).map(|i| json!({"id": i}))).await?;
    let config = ws.write(&ws.config().pipeline(pipeline.transform(faulty)))?;
    let config = floe::config::Config::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let result = tokio::time::timeout(
        Duration::from_secs(120),
        floe::run(config, std::future::pending()),
    )
    .await?;
    let err = result
        .expect_err("the pipeline must stop with an error")
        .to_string();
    assert_eq!(
        ws.committed_rows("wasm", topic).await?,
        0,
        "nothing of a failed batch is committed"
    );
    Ok(err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_on_every_record_stop_the_pipeline_with_a_clear_error() -> Result<()> {
    // A fault on one record is isolated and dead-lettered (tests/sandbox.rs); a plugin
    // that faults on record after record, each alone, is broken: the pipeline stops.
    let panic = stops_with("panics", faulty(json!({"mode": "panic"}))).await?;
    assert!(
        panic.contains("plugin faulty panicked: faulty plugin panicked on purpose at offset"),
        "{panic}"
    );

    let fuel = stops_with(
        "spins",
        faulty(json!({"mode": "spin"})).limit("fuel", 50_000_000),
    )
    .await?;
    assert!(
        fuel.contains("plugin faulty exceeded its fuel limit (50000000 per batch"),
        "{fuel}"
    );

    let memory = stops_with(
        "hogs",
        faulty(json!({"mode": "hog", "bytes": 67108864})).limit("memory", "16MiB"),
    )
    .await?;
    assert!(
        memory.contains("plugin faulty exceeded its memory limit (16 MiB"),
        "{memory}"
    );

    let init = stops_with("refuses", faulty(json!({"mode": "init_error"}))).await?;
    assert!(
        init.contains("plugin faulty: init failed: faulty: init refused"),
        "{init}"
    );
    Ok(())
}

const TYPES: [&str; 3] = ["view", "click", "buy"];

fn nested_event(i: i64) -> Value {
    let kind = TYPES[(i % 3) as usize];
    let at = format!("{:02}/01/2024 10:{:02}:00", 1 + i % 28, i % 60);
    json!({
        "id": i,
        "evt": {"type": kind, "at": at},
        "user": {"name": format!("u{i}"), "geo": {"country": "DE", "city": "Berlin"}},
        "usr_id": format!("id-{i}"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_timestamp_flatten_chain() -> Result<()> {
    const N: i64 = 300;
    let (_broker, ws, pipeline) = setup("nested", (0..N).map(nested_event)).await?;
    let config = ws.write(
        &ws.config().pipeline(
            pipeline
                .transform(plugin(
                    "rename",
                    json!({"fields": {"usr_id": "user_id", "user.name": "user.full_name"}}),
                ))
                .transform(plugin(
                    "timestamp",
                    json!({"field": "evt.at", "format": "%d/%m/%Y %H:%M:%S", "offset": "+01:00"}),
                ))
                .transform(plugin("flatten", json!({"separator": "__"}))),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("wasm", "nested", N, Duration::from_secs(120))
        .await?;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "wasm", "nested", "id")?;
        assert_eq!(ids(dump.rows()), (0..N).collect(), "{reader}");
        let columns = dump.columns();
        for c in [
            "id",
            "evt__type",
            "evt__at",
            "user__full_name",
            "user__geo__country",
            "user__geo__city",
            "user_id",
        ] {
            assert!(
                columns.contains(&c.to_string()),
                "{reader}: {c} in {columns:?}"
            );
        }
        for c in ["usr_id", "evt", "user", "user__name"] {
            assert!(
                !columns.contains(&c.to_string()),
                "{reader}: {c} in {columns:?}"
            );
        }
        for row in dump.rows() {
            let i = row["id"].as_i64().unwrap();
            assert_eq!(row["user_id"], json!(format!("id-{i}")), "{reader}");
            assert_eq!(row["user__full_name"], json!(format!("u{i}")), "{reader}");
            assert_eq!(row["evt__type"], json!(TYPES[(i % 3) as usize]));
            // 10:MM local at +01:00 is 09:MM UTC, read back as a timestamp.
            let at = row["evt__at"].as_str().unwrap_or_default().to_string();
            assert!(
                at.contains(&format!("2024-01-{:02}", 1 + i % 28))
                    && at.contains(&format!("09:{:02}:00", i % 60)),
                "{reader}: {at}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flat_map_explodes_orders_into_items() -> Result<()> {
    const N: i64 = 100;
    let order = |i: i64| {
        json!({
            "order": i,
            "items": (0..(i % 4)).map(|k| json!({"sku": format!("s{k}"), "qty": k + 1})).collect::<Vec<_>>(),
        })
    };
    let (_broker, ws, pipeline) = setup("orders", (0..N).map(order)).await?;
    let config = ws.write(&ws.config().pipeline(pipeline.transform(plugin(
        "explode",
        json!({"field": "items", "as": "item", "index": "line"}),
    ))))?;
    let expected: i64 = (0..N).map(|i| i % 4).sum();
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("wasm", "orders", expected, Duration::from_secs(120))
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "wasm", "orders", "order")?;
        assert_eq!(
            dump.rows().len() as i64,
            expected,
            "{reader}: one row per item, none twice"
        );
        let mut lines: BTreeSet<(i64, i64)> = BTreeSet::new();
        for row in dump.rows() {
            let order = row["order"].as_i64().unwrap();
            let line = row["line"].as_i64().unwrap();
            assert!(line < order % 4, "{reader}: {row}");
            assert_eq!(
                row["item"]["sku"],
                json!(format!("s{line}")),
                "{reader}: {row}"
            );
            assert_eq!(row["item"]["qty"], json!(line + 1), "{reader}: {row}");
            assert!(
                row.get("items").is_none_or(Value::is_null),
                "{reader}: {row}"
            );
            lines.insert((order, line));
        }
        assert_eq!(lines.len() as i64, expected, "{reader}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_two_tables_commits_loses_and_duplicates_nothing() -> Result<()> {
    const N: i64 = 600;
    let (_broker, ws, pipeline) = setup("routed", (0..N).map(event)).await?;
    let config = ws.write(
        &ws.config().pipeline(
            pipeline
                .stream("eu", "routed_eu")
                .stream("us", "routed_us")
                .transform(plugin(
                    "route",
                    json!({"field": "region", "routes": {"eu": "eu", "us": "us"}}),
                )),
        ),
    )?;
    // Killed right after the first of the three tables' commits lands (the others may
    // be in flight: a pipeline commits its tables concurrently).
    let mut agent =
        floe_tests::AgentProcess::start_at_failpoint(&config, floe::failpoint::AFTER_COMMIT, &[])?;
    agent.wait_for_failpoint(Duration::from_secs(90))?;
    agent.kill9()?;
    let mut landed = Vec::new();
    for table in ["routed", "routed_eu", "routed_us"] {
        landed.push(ws.committed_rows("wasm", table).await?);
    }
    assert!(
        landed.iter().any(|&rows| rows > 0),
        "a table committed before the kill: {landed:?}"
    );

    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    for table in ["routed", "routed_eu", "routed_us"] {
        ws.wait_for_rows("wasm", table, N / 3, Duration::from_secs(90))
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.terminate()?;
    for (table, region) in [("routed", 2), ("routed_eu", 0), ("routed_us", 1)] {
        for reader in ["pyiceberg", "duckdb"] {
            let dump = ws.read(reader, "wasm", table, "id")?;
            let expected: BTreeSet<i64> = (0..N).filter(|i| i % 3 == region).collect();
            assert_eq!(
                dump.rows().len(),
                expected.len(),
                "{reader}: {table} has no duplicates"
            );
            assert_eq!(
                ids(dump.rows()),
                expected,
                "{reader}: {table} has every record"
            );
        }
    }
    Ok(())
}
