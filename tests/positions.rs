//! Where reading starts: `start = "latest"` applies once, on a partition's first
//! assignment, and survives a restart before any record arrived.

use std::time::Duration;

use anyhow::Result;
use floe_tests::{Broker, PipelineSpec, Workspace, spawn_agent, wait_for_messages};

fn messages(from: i64, to: i64) -> Vec<floe_tests::Message> {
    (from..to)
        .map(|i| (None, Some(format!(r#"{{"id": {i}}}"#).into_bytes())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_applies_once_and_survives_a_restart_without_records() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("events", 1).await?;
    let ws = Workspace::new()?;
    // The table exists already (another pipeline created it); `late` starts at the end.
    let first = ws.write_config(&PipelineSpec {
        name: "early",
        bootstrap: &broker.bootstrap,
        topic: "events",
        namespace: "ns",
        table: "events",
        commit_interval: "1s",
    })?;
    // One batch per record: Tansu answers "latest" with the end of the last batch's
    // first record, so only one-record batches give the true end here.
    for i in 0..10 {
        broker.produce("events", &messages(i, i + 1)).await?;
    }
    let agent = spawn_agent(&first)?;
    ws.wait_for_rows("ns", "events", 10, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    let late = ws.write_config(&PipelineSpec {
        name: "late",
        bootstrap: &broker.bootstrap,
        topic: "events",
        namespace: "ns",
        table: "events",
        commit_interval: "1s",
    })?;
    let text = std::fs::read_to_string(&late)?.replace(
        "topics = [\"events\"]",
        "topics = [\"events\"]\nstart = \"latest\"",
    );
    std::fs::write(&late, text)?;
    let catalog = ws.catalog().await?;
    // First assignment: the end (10) is recorded although no record arrives.
    let agent = spawn_agent(&late)?;
    wait_for_messages(
        catalog.as_ref(),
        "ns",
        "events",
        "late",
        10,
        Duration::from_secs(60),
    )
    .await?;
    agent.stop().await?;
    // Records produced while the agent is down are read after the restart: `latest`
    // does not apply a second time.
    broker.produce("events", &messages(10, 15)).await?;
    let agent = spawn_agent(&late)?;
    wait_for_messages(
        catalog.as_ref(),
        "ns",
        "events",
        "late",
        15,
        Duration::from_secs(60),
    )
    .await?;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "events", "id")?;
        let late_rows = dump
            .rows()
            .iter()
            .filter(|r| r["id"].as_i64().is_some_and(|i| i >= 10))
            .count();
        assert_eq!(late_rows, 5, "{reader}: the records produced while down");
        assert_eq!(dump.rows().len(), 15, "{reader}");
    }
    Ok(())
}
