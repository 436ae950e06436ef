//! `[pipelines.schema]` end to end: `on_incompatible = "fail"` stops with field, types and
//! offset; `coerce` stores the value's text in a string column; overrides force types.

use std::time::Duration;

use anyhow::Result;
use floe_tests::{Broker, Pipeline, Workspace, spawn_agent};
use serde_json::json;

async fn setup(
    broker: &Broker,
    topic: &str,
    values: &[&str],
    schema: impl FnOnce(Pipeline) -> Pipeline,
) -> Result<(Workspace, std::path::PathBuf)> {
    broker.create_topic(topic, 1).await?;
    let batch: Vec<_> = values
        .iter()
        .map(|v| (None, Some(v.as_bytes().to_vec())))
        .collect();
    broker.produce(topic, &batch).await?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(schema(
            ws.pipeline(topic, &broker.bootstrap, topic)
                .table("ns", topic),
        )),
    )?;
    Ok((ws, config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_policy_stops_naming_field_types_and_offset() -> Result<()> {
    let broker = Broker::start()?;
    let (ws, config) = setup(
        &broker,
        "strict",
        &[
            r#"{"id": 1}"#,
            r#"{"id": 2}"#,
            r#"{"id": {"nested": true}}"#,
        ],
        |p| p.schema("on_incompatible", "fail"),
    )
    .await?;
    let error = spawn_agent(&config)?
        .finished(Duration::from_secs(60))
        .await?
        .expect_err("the pipeline stops");
    let message = error.to_string();
    assert!(
        message.contains("strict/0@2")
            && message.contains("field `id`: column is long, value is object"),
        "{message}"
    );
    assert_eq!(ws.committed_rows("ns", "strict").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coerce_policy_and_overrides_shape_the_table() -> Result<()> {
    let broker = Broker::start()?;
    let (ws, config) = setup(
        &broker,
        "loose",
        &[
            r#"{"id": 1, "note": "text", "price": "12.50", "day": "2024-01-02", "at": "2024-01-02T03:04:05Z"}"#,
            r#"{"id": 2, "note": 42, "price": 3.1, "day": "2024-01-03", "at": "later"}"#,
            r#"{"id": 3, "note": {"a": [1]}, "price": "1.999", "day": "2024-01-04"}"#,
        ],
        |p| {
            p.schema("on_incompatible", "coerce")
                .schema("detect_timestamps", false)
                .type_override("price", "decimal(18,2)")
                .type_override("day", "date")
        },
    )
    .await?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "loose", 2, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "loose", "id")?;
        let types: Vec<_> = dump.0["columns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c[0].as_str().unwrap().starts_with("_kafka"))
            .cloned()
            .collect();
        assert_eq!(
            types,
            vec![
                json!(["id", "long"]),
                json!(["note", "string"]),
                json!(["price", "decimal(18, 2)"]),
                json!(["day", "date"]),
                json!(["at", "string"]),
            ],
            "{reader}"
        );
        let rows = dump.rows();
        // Row 3's price has 3 fraction digits: no string column to coerce into, dead-lettered.
        assert_eq!(rows.len(), 2, "{reader}");
        assert_eq!(rows[0]["price"], "12.50", "{reader}");
        assert_eq!(rows[1]["note"], "42", "{reader}: coerced to its text");
        assert_eq!(rows[1]["price"], "3.10", "{reader}");
        assert_eq!(rows[1]["day"], "2024-01-03", "{reader}");
    }
    let letters = floe::dead_letter::DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].offset, 2);
    assert!(
        letters[0]
            .reason
            .contains("field `price`: column is decimal(18, 2)"),
        "{}",
        letters[0].reason
    );
    Ok(())
}
