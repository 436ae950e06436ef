//! The consumer group with a real broker: partitions that reach a paused source wait
//! too (memory stays flat while the pipeline cannot take records), and a pipeline that
//! stops leaves the group so its partitions move to a healthy member.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use floe::source::{Assignment, KafkaSource, PositionLookup, Source, SourceConfig, SourceEvent};
use floe_tests::{
    AgentProcess, Broker, Config, Message, Pipeline, Workspace, free_port, metric_value,
    scrape_metrics,
};
use serde_json::json;

/// Records produced to the paused source's topic.
const TOTAL: usize = 150_000;

/// Every partition starts at the configured start (no table).
struct NoTables;

impl PositionLookup for NoTables {
    fn lookup(&self, tps: &[floe::record::TopicPartition]) -> Vec<Assignment> {
        tps.iter()
            .map(|tp| Assignment {
                tp: tp.clone(),
                position: None,
                stored: vec![None],
            })
            .collect()
    }
}

fn source_config(bootstrap: &str, topic: &str) -> Result<SourceConfig> {
    Ok(toml::from_str(&format!(
        "bootstrap_servers = \"{bootstrap}\"\ngroup_id = \"g-{topic}\"\ntopics = [\"{topic}\"]\n\
         [properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         \"max.poll.interval.ms\" = \"20000\""
    ))?)
}

/// Takes events until `done` says so (or fails after `timeout`); returns the records'
/// (partition, offset) seen meanwhile.
fn take_until(
    source: &KafkaSource,
    timeout: Duration,
    mut done: impl FnMut(&SourceEvent) -> bool,
    seen: &mut BTreeSet<(i32, i64)>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = source.events().recv_timeout(left) else {
            bail!("timed out waiting for an event");
        };
        if let SourceEvent::Records(_, messages) = &event {
            seen.extend(messages.iter().map(|m| (m.partition, m.offset)));
        }
        if done(&event) {
            return Ok(());
        }
    }
}

/// Partitions assigned to a source while it is paused (its pipeline is behind) are
/// paused too: what it queues stays put instead of growing with the traffic of the
/// new partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_assigned_while_paused_wait_too() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("busy", 4).await?;
    let config = source_config(&broker.bootstrap, "busy")?;
    let mut seen = BTreeSet::new();
    let a = KafkaSource::start("a", &config, Arc::new(NoTables))?;
    take_until(
        &a,
        Duration::from_secs(60),
        |e| matches!(e, SourceEvent::Assigned(_)),
        &mut seen,
    )?;
    // B joins and takes some partitions from A.
    let b = KafkaSource::start("b", &config, Arc::new(NoTables))?;
    let (a_events, b_events) = (a.events().clone(), b.events().clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        crossbeam_channel::select! {
            recv(a_events) -> _ => {}
            recv(b_events) -> e => if let Ok(SourceEvent::Assigned(_)) = e { break },
            default(Duration::from_millis(100)) => {}
        }
        ensure!(Instant::now() < deadline, "B got no partitions");
    }
    // More traffic on every partition than A's channel holds, while nobody reads A: it
    // falls behind and pauses.
    let messages: Vec<Message> = (0..TOTAL)
        .map(|i| {
            (
                Some(format!("k{i}").into_bytes()),
                Some(json!({"i": i}).to_string().into_bytes()),
            )
        })
        .collect();
    broker.produce("busy", &messages).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = a.queued_records();
    ensure!(before > 0, "A did not fall behind");
    // B leaves: its partitions go to A, which is still paused.
    drop(b_events);
    Box::new(b).shutdown();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let after = a.queued_records();
    ensure!(
        after.saturating_sub(before) < 50,
        "A queued {before} records before B left and {after} after: the partitions it got while paused were read"
    );
    // Reading again, A gets every record of every partition.
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < TOTAL {
        ensure!(
            Instant::now() < deadline,
            "A read {} distinct records of {TOTAL}",
            seen.len()
        );
        if let Ok(SourceEvent::Records(_, messages)) =
            a.events().recv_timeout(Duration::from_millis(200))
        {
            seen.extend(messages.iter().map(|m| (m.partition, m.offset)));
        }
    }
    Box::new(a).shutdown();
    Ok(())
}

/// An agent runs two pipelines; one of them stops on a record it is configured to fail
/// on (`on_incompatible = "fail"`). That pipeline leaves the consumer group: a second
/// agent (which dead-letters such records) gets every partition and ingests everything
/// else, value for value. The stopped pipeline reports no partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pipeline_leaves_the_group() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 3).await?;
    broker.create_topic("side", 1).await?;
    let ws = Workspace::new()?;
    let pipeline = |name: &str, topic: &str, dl: &str| {
        Pipeline::new(name, &broker.bootstrap, topic)
            .property("session.timeout.ms", "6000")
            .property("heartbeat.interval.ms", "500")
            .property("max.poll.interval.ms", "20000")
            .sink("local", "ns", name)
            .commit_interval("1s")
            .dead_letter(ws.path(&format!("{dl}.ndjson")))
    };
    let config = || Config::new().catalog("local", ws.embedded_catalog());
    let metrics = format!("127.0.0.1:{}", free_port());
    let a_config = config()
        .metrics(&metrics)
        .pipeline(pipeline("main", "orders", "a-main").schema("on_incompatible", "fail"))
        .pipeline(pipeline("other", "side", "a-other"))
        .write(ws.path("a.toml"))?;
    let b_config = config()
        .pipeline(pipeline("main", "orders", "b-main"))
        .write(ws.path("b.toml"))?;
    let good = |from: i64, to: i64| -> Vec<Message> {
        (from..to)
            .map(|i| {
                (
                    Some(format!("k{}", i % 7).into_bytes()),
                    Some(
                        json!({"id": i, "v": format!("v{i}")})
                            .to_string()
                            .into_bytes(),
                    ),
                )
            })
            .collect()
    };
    broker.produce("orders", &good(0, 200)).await?;
    broker.produce("side", &good(0, 1)).await?;
    let mut a = AgentProcess::start(&a_config, &[])?;
    ws.wait_for_rows("ns", "main", 200, Duration::from_secs(90))
        .await?;
    broker
        .produce(
            "orders",
            &[(
                Some(b"k1".to_vec()),
                Some(br#"{"id": "not a number"}"#.to_vec()),
            )],
        )
        .await?;
    broker.produce("orders", &good(200, 500)).await?;
    a.wait_for_line("pipeline stopped", Duration::from_secs(60))?;
    let text = scrape_metrics(&metrics)?;
    assert_eq!(
        metric_value(&text, "floe_partitions_assigned", &["pipeline=\"main\""]),
        Some(0.0),
        "{text}"
    );
    let b = AgentProcess::start(&b_config, &[])?;
    if let Err(e) = ws
        .wait_for_rows("ns", "main", 500, Duration::from_secs(120))
        .await
    {
        bail!("{e}\n--- agent B:\n{}", b.output());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.terminate()?;
    // A ends with its pipeline's error (exit status 1).
    let _ = a.terminate();
    let records = floe_tests::reference::read_topic(
        &broker.bootstrap,
        "orders",
        501,
        Duration::from_secs(60),
    )?;
    let good_records: Vec<_> = records
        .into_iter()
        .filter(|r| r.object().is_some_and(|o| o["id"].is_i64()))
        .collect();
    let expected = floe_tests::reference::append_rows(&good_records);
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "main", "id")?;
        floe_tests::reference::assert_rows(
            reader,
            &dump,
            &expected,
            &["_kafka_partition", "_kafka_offset"],
            &[],
        )?;
    }
    let letters = floe::dead_letter::DeadLetterWriter::read_all(&ws.path("b-main.ndjson"))?;
    assert_eq!(letters.len(), 1, "{letters:?}");
    Ok(())
}
