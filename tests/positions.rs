//! Where reading starts: `start = "latest"` applies once, on a partition's first
//! assignment, and survives a restart before any record arrived.

use std::time::Duration;

use anyhow::Result;
use floe_tests::{Broker, PipelineSpec, Workspace, spawn_agent, wait_for_messages};

/// A pipeline `p` reading topic `t` from `start` into `ns.t`, for a scripted source (the
/// broker address is never dialled).
fn scripted_config(ws: &Workspace, start: &str) -> Result<std::path::PathBuf> {
    ws.write(
        &ws.config().pipeline(
            ws.pipeline("p", "127.0.0.1:9", "t")
                .group_id("g-p")
                .start(start)
                .sink("local", "ns", "t")
                .commit_interval("1s"),
        ),
    )
}

/// The ids DuckDB reads from `ns.table`, in order.
fn ids(ws: &Workspace, table: &str) -> Result<Vec<i64>> {
    let dump = ws.read("duckdb", "ns", table, "id")?;
    Ok(dump
        .rows()
        .iter()
        .filter_map(|r| r["id"].as_i64())
        .collect())
}

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

/// A partition revoked and assigned back while a failed commit of its records waits
/// for its retry is read again from what the table stores, which has not moved yet.
/// The records read again must not be written a second time next to the ones waiting:
/// after the retry every record is in the table once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_back_while_its_commit_waits_for_a_retry_is_written_once() -> Result<()>
{
    use floe::source::SourceCommand;
    use floe_tests::scripted::{ScriptedPipeline, messages as scripted};
    use std::sync::Arc;

    let ws = Workspace::new()?;
    let config = scripted_config(&ws, "earliest")?;
    let (catalog, faults) = floe_tests::inject::faulty_catalog(ws.dir.path(), "local").await?;
    let values: Vec<String> = (0..20).map(|i| format!(r#"{{"id": {i}}}"#)).collect();
    let log: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
    let p = ScriptedPipeline::start_on(&config, Some(catalog)).await?;
    p.assign("t", &[(0, None, vec![None])]);
    p.push(scripted("t", 0, 0, &log[..10]));
    ws.wait_for_rows("ns", "t", 10, Duration::from_secs(60))
        .await?;

    // Every file read fails, so every commit attempt fails at once (preparing its
    // manifests) and the committer waits for its retry, longer each time, taking
    // chunks meanwhile.
    faults.fail_reads(u32::MAX);
    p.push(scripted("t", 0, 10, &log[10..]));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut served = p.seeks().len();
    let tp = (Arc::from("t"), 0);
    p.revoke(vec![tp]);
    p.assign("t", &[(0, Some(10), vec![Some(10)])]);
    p.push(scripted("t", 0, 10, &log[10..]));
    p.drained(Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    faults.fail_reads(0);
    // A rewind seeks: serve it as the consumer would.
    let started = std::time::Instant::now();
    loop {
        let seeks = p.seeks();
        for seek in &seeks[served..] {
            if let SourceCommand::Seek { positions, .. } = seek {
                for (_, at) in positions {
                    let from = at.unwrap_or(0) as usize;
                    p.push(scripted("t", 0, from as i64, &log[from..]));
                }
            }
        }
        served = seeks.len();
        if ws.committed_rows("ns", "t").await? >= 20 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "never committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.stop().await??;
    assert_eq!(
        ids(&ws, "t")?,
        (0..20).collect::<Vec<_>>(),
        "every record once"
    );
    Ok(())
}

/// A partition assigned with neither a position nor stored offsets (`start = "latest"`
/// when the end could not be read: the consumer reads from the end it sees) starts at
/// its first record. A rewind before its first commit must read again from there, not
/// from a later end that would skip the records between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_started_at_an_unknown_end_rewinds_to_its_first_record() -> Result<()> {
    use floe::source::SourceCommand;
    use floe_tests::scripted::{ScriptedPipeline, messages as scripted};

    let ws = Workspace::new()?;
    let config = scripted_config(&ws, "latest")?;
    let (catalog, faults) = floe_tests::inject::faulty_catalog(ws.dir.path(), "local").await?;
    let values: Vec<String> = (0..10).map(|i| format!(r#"{{"id": {i}}}"#)).collect();
    let log: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
    let p = ScriptedPipeline::start_on(&config, Some(catalog)).await?;
    // Partition 0 makes the table (its offsets stored); partition 1 comes later with
    // no position and nothing stored, and reads from offset 5.
    p.assign("t", &[(0, Some(0), vec![None])]);
    p.push(scripted("t", 0, 0, &log[..5]));
    ws.wait_for_rows("ns", "t", 5, Duration::from_secs(60))
        .await?;
    // Its first data file write fails: the pipeline rewinds before its first commit.
    faults.fail_writes(1);
    p.assign("t", &[(1, None, vec![None])]);
    p.push(scripted("t", 1, 5, &log[5..]));
    let started = std::time::Instant::now();
    let seek = loop {
        if let Some(SourceCommand::Seek { positions, .. }) = p.seeks().last() {
            break positions.clone();
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "no rewind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let at = seek
        .iter()
        .find(|(tp, _)| tp.1 == 1)
        .and_then(|(_, at)| *at);
    assert_eq!(
        at,
        Some(5),
        "the rewind reads again from the first record read"
    );
    p.push(scripted("t", 1, 5, &log[5..]));
    ws.wait_for_rows("ns", "t", 10, Duration::from_secs(60))
        .await?;
    p.stop().await??;
    assert_eq!(ids(&ws, "t")?, (0..10).collect::<Vec<_>>());
    Ok(())
}
