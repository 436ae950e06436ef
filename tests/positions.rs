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

/// `latest` with no table yet: the first assignment pins the end in the consumer group,
/// so records produced while the agent is down (still no table: nothing arrived) are
/// read after the restart instead of skipped by a second `latest`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_without_a_table_applies_once_too() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("fresh", 1).await?;
    for i in 0..3 {
        broker.produce("fresh", &messages(i, i + 1)).await?;
    }
    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "fresh",
        bootstrap: &broker.bootstrap,
        topic: "fresh",
        namespace: "ns",
        table: "fresh",
        commit_interval: "1s",
    })?;
    let text = std::fs::read_to_string(&config)?.replace(
        "topics = [\"fresh\"]",
        "topics = [\"fresh\"]\nstart = \"latest\"",
    );
    std::fs::write(&config, text)?;
    // Started and stopped with nothing new to read: no table is created.
    let agent = spawn_agent(&config)?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    agent.stop().await?;
    assert_eq!(ws.committed_rows("ns", "fresh").await?, 0);
    for i in 3..8 {
        broker.produce("fresh", &messages(i, i + 1)).await?;
    }
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "fresh", 5, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "fresh", "id")?;
        let ids: Vec<i64> = dump
            .rows()
            .iter()
            .map(|r| r["id"].as_i64().expect("id"))
            .collect();
        assert_eq!(ids, (3..8).collect::<Vec<_>>(), "{reader}");
    }
    Ok(())
}

/// A topic deleted and created again restarts its offsets below what the table stores:
/// the agent says so (log, `floe_offset_resets_total`, `floe.offset-resets` in the
/// snapshot summary) instead of skipping silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_restarted_below_the_stored_offset_is_recorded() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("again", 1).await?;
    broker.produce("again", &messages(0, 10)).await?;
    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "again",
        bootstrap: &broker.bootstrap,
        topic: "again",
        namespace: "ns",
        table: "again",
        commit_interval: "1s",
    })?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "again", 10, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    broker.delete_topic("again").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.create_topic("again", 1).await?;
    // One batch per record (see above: Tansu's end of a multi-record batch).
    for i in 100..103 {
        broker.produce("again", &messages(i, i + 1)).await?;
    }

    // Metrics on for the restart (a listener lives as long as the test process).
    let metrics = format!("127.0.0.1:{}", floe_tests::free_port());
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        format!("[metrics]\nlisten = \"{metrics}\"\n{text}"),
    )?;
    let agent = spawn_agent(&config)?;
    let catalog = ws.catalog().await?;
    let ident = iceberg::TableIdent::from_strs(["ns", "again"])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let recorded = loop {
        let table = catalog.load_table(&ident).await?;
        let found = table.metadata().snapshots().find_map(|s| {
            s.summary()
                .additional_properties
                .get("floe.offset-resets")
                .cloned()
        });
        if let Some(v) = found {
            break v;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no snapshot records the reset"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // [stored offset, where the log now ends] (3 records after the topic came back).
    assert_eq!(recorded, r#"{"again":{"0":[10,3]}}"#);
    let text = floe_tests::scrape_metrics(&metrics)?;
    assert_eq!(
        floe_tests::metric_value(&text, "floe_offset_resets_total", &["pipeline=\"again\""]),
        Some(1.0),
        "{text}"
    );
    agent.stop().await?;
    Ok(())
}
