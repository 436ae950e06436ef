//! Several agents (separate `floe` processes) in one consumer group share a table:
//! partitions move between them on kills, stops and starts, and both readers see every
//! record exactly once (append) and one live row per key (upsert keyed by a payload
//! field, keys spread over partitions). Also: two agents in a steady state both advance
//! (no starvation, no fences), and a zombie paused past its session cannot commit.
//!
//! The same come-and-go scenario runs against a REST catalog (rustberg over moto S3), where
//! the agents' commits race through the catalog's conditional updates.
//!
//! `FLOE_SCALE_RECORDS` sets the record count (default 24,000, what CI runs; the full
//! run is `FLOE_SCALE_RECORDS=200000`, see scripts/scale.sh).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use floe_tests::lake::Lake;
use floe_tests::{
    AgentProcess, Broker, Message, free_port, metric_value, scrape_metrics, wait_for_messages,
};
use serde_json::json;

const PARTITIONS: i32 = 12;
const KEYS: i64 = 1000;

fn records() -> i64 {
    std::env::var("FLOE_SCALE_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24_000)
}

/// A lake (embedded, or REST over S3) with the tables in namespace `scale`.
fn scale_lake(rest: bool) -> Result<Lake> {
    let mut lake = if rest {
        Lake::rest()?
    } else {
        Lake::embedded()?
    };
    lake.namespace = "scale".into();
    Ok(lake)
}

/// Writes one agent's config: an append pipeline and an upsert pipeline on `topic`,
/// each in its own consumer group, metrics on `metrics`.
///
/// `max.poll.interval.ms` is also the rebalance timeout: when a member leaves while
/// another has died but is not yet expired, the test broker waits that long for the
/// dead one to rejoin, with partitions unassigned meanwhile (with the default 300 s,
/// longer than the test waits). Floe's poll thread never pauses for long, so 20 s is
/// safe.
fn agent_config(
    lake: &Lake,
    broker: &Broker,
    topic: &str,
    metrics: &str,
    n: usize,
) -> Result<PathBuf> {
    let pipeline = |name: &str, table: &str| {
        lake.pipeline(name, &broker.bootstrap, topic, table)
            .property("session.timeout.ms", "6000")
            .property("heartbeat.interval.ms", "1000")
            .property("max.poll.interval.ms", "20000")
            .dead_letter(lake.ws.path(&format!("dead-letter-{name}-{n}.ndjson")))
    };
    let config = lake
        .config()
        .metrics(metrics)
        .pipeline(pipeline("append", "events"))
        .pipeline(pipeline("upsert", "latest").upsert(&["id"]));
    lake.write(&format!("agent-{n}.toml"), &config)
}

struct Agent {
    process: AgentProcess,
    metrics: String,
}

fn start_agent(lake: &Lake, broker: &Broker, topic: &str, n: usize) -> Result<Agent> {
    let metrics = format!("127.0.0.1:{}", free_port());
    let config = agent_config(lake, broker, topic, &metrics, n)?;
    Ok(Agent {
        process: AgentProcess::start(&config, &[])?,
        metrics,
    })
}

fn signal(agent: &AgentProcess, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .args([sig, &agent.pid().to_string()])
        .status()?;
    ensure!(status.success(), "kill {sig} failed");
    Ok(())
}

/// The record with sequence number `i`. The upsert key `id` repeats every `KEYS` records
/// and is also the message key, so all versions of a key are in one partition (the
/// last one is well defined) while partitions, and so keys, move between agents.
fn message(i: i64) -> Message {
    let id = i % KEYS;
    let value = json!({"seq": i, "id": id, "version": i / KEYS, "note": format!("n{i}")});
    (
        Some(format!("k{id}").into_bytes()),
        Some(value.to_string().into_bytes()),
    )
}

/// Produces `n` records in batches while the test does other things; counts produced.
fn producer(
    broker: &Broker,
    topic: &str,
    n: i64,
    produced: Arc<AtomicI64>,
) -> tokio::task::JoinHandle<Result<()>> {
    let bootstrap = broker.bootstrap.clone();
    let topic = topic.to_string();
    tokio::spawn(async move {
        let mut i = 0;
        while i < n {
            let end = (i + 500).min(n);
            let batch: Vec<Message> = (i..end).map(message).collect();
            floe_tests::produce_to(&bootstrap, &topic, &batch).await?;
            produced.store(end, Ordering::SeqCst);
            i = end;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    })
}

async fn wait_produced(produced: &AtomicI64, at_least: i64) {
    while produced.load(Ordering::SeqCst) < at_least {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stored offsets per partition of a pipeline in a table.
async fn stored(lake: &Lake, table: &str, pipeline: &str) -> Result<BTreeMap<i32, i64>> {
    let catalog = lake.catalog().await?;
    let t = catalog
        .load_table(&iceberg::TableIdent::from_strs(["scale", table])?)
        .await?;
    Ok(floe_iceberg::OffsetMap::from_table(t.metadata(), pipeline)?
        .0
        .into_iter()
        .map(|((_, p), o)| (p, o))
        .collect())
}

/// Checks both tables against what the broker holds, every column of every row, with
/// both readers: every record once in `events`, the last version of every key in
/// `latest`.
async fn check_tables(lake: &Lake, broker: &Broker, topic: &str, n: i64) -> Result<()> {
    let catalog = lake.catalog().await?;
    for (table, pipeline) in [("events", "append"), ("latest", "upsert")] {
        wait_for_messages(
            catalog.as_ref(),
            "scale",
            table,
            pipeline,
            n,
            Duration::from_secs(180),
        )
        .await?;
        let offsets = stored(lake, table, pipeline).await?;
        ensure!(
            offsets.len() == PARTITIONS as usize,
            "{table}: offsets of {} partitions stored, expected {PARTITIONS}: {offsets:?}",
            offsets.len()
        );
        ensure!(offsets.values().sum::<i64>() == n, "{table}: {offsets:?}");
    }
    let records = floe_tests::reference::read_topic(
        &broker.bootstrap,
        topic,
        n as usize,
        Duration::from_secs(120),
    )?;
    let events = floe_tests::reference::append_rows(&records);
    let latest = floe_tests::reference::upsert_rows(
        &records,
        &floe_tests::reference::UpsertKey::Field("id".into()),
    );
    for reader in ["pyiceberg", "duckdb"] {
        let dump = lake.read(reader, "events", "seq")?;
        floe_tests::reference::assert_rows(
            &format!("{reader}: events"),
            &dump,
            &events,
            &["_kafka_partition", "_kafka_offset"],
            &[],
        )?;
        let dump = lake.read(reader, "latest", "id")?;
        floe_tests::reference::assert_rows(
            &format!("{reader}: latest"),
            &dump,
            &latest,
            &["id"],
            &["_op"],
        )?;
    }
    Ok(())
}

/// Three agents share both tables while one is killed with SIGKILL, one stopped with
/// SIGTERM and a fourth started mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_come_and_go_and_the_tables_stay_exact() -> Result<()> {
    come_and_go(&scale_lake(false)?, records()).await
}

/// The same through a REST catalog over S3 (half the records: every commit is a few
/// HTTP round trips and S3 uploads on this 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_come_and_go_on_a_rest_catalog_and_the_tables_stay_exact() -> Result<()> {
    come_and_go(&scale_lake(true)?, records() / 2).await
}

async fn come_and_go(lake: &Lake, n: i64) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("events", PARTITIONS).await?;
    let produced = Arc::new(AtomicI64::new(0));
    let a = start_agent(lake, &broker, "events", 1)?;
    let b = start_agent(lake, &broker, "events", 2)?;
    let c = start_agent(lake, &broker, "events", 3)?;
    let producing = producer(&broker, "events", n, produced.clone());
    wait_produced(&produced, n / 3).await;
    // A dies without a word; B and C take its partitions once its session expires.
    a.process.kill9()?;
    settle(&[&b, &c], "after A was killed").await?;
    wait_produced(&produced, n / 2).await;
    // B leaves cleanly, D joins.
    let out = b.process.terminate()?;
    ensure!(!out.contains("panicked"), "{out}");
    let d = start_agent(lake, &broker, "events", 4)?;
    settle(&[&c, &d], "after B left and D joined").await?;
    wait_produced(&produced, 2 * n / 3).await;
    producing.await??;
    if let Err(e) = check_tables(lake, &broker, "events", n).await {
        bail!(
            "{e}\nstored offsets: events {:?}, latest {:?}\n--- agent C:\n{}\n--- agent D:\n{}",
            stored(lake, "events", "append").await,
            stored(lake, "latest", "upsert").await,
            tail(&c.process.output()),
            tail(&d.process.output())
        );
    }
    let fences: f64 = [&c, &d]
        .iter()
        .filter_map(|x| scrape_metrics(&x.metrics).ok())
        .filter_map(|m| metric_value(&m, "floe_fences_total", &[]))
        .sum();
    println!("fences counted by the surviving agents: {fences}");
    c.process.terminate()?;
    d.process.terminate()?;
    Ok(())
}

/// Two agents with equal intervals and steady traffic: both keep committing and every
/// partition advances; fences stay near zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_in_a_steady_state_both_advance() -> Result<()> {
    let n = records() / 2;
    let broker = Broker::start()?;
    broker.create_topic("steady", PARTITIONS).await?;
    let lake = scale_lake(false)?;
    let a = start_agent(&lake, &broker, "steady", 1)?;
    let b = start_agent(&lake, &broker, "steady", 2)?;
    // Let the group settle before the traffic starts.
    wait_assigned(
        &[&a, &b],
        "append",
        PARTITIONS as f64,
        Duration::from_secs(60),
    )
    .await?;
    let produced = Arc::new(AtomicI64::new(0));
    let producing = producer(&broker, "steady", n, produced.clone());
    producing.await??;
    check_tables(&lake, &broker, "steady", n).await?;
    let committed = |agent: &Agent| -> Result<(f64, f64)> {
        let m = scrape_metrics(&agent.metrics)?;
        Ok((
            metric_value(&m, "floe_commits_total", &["pipeline=\"append\""]).unwrap_or(0.0),
            metric_value(&m, "floe_fences_total", &["pipeline=\"append\""]).unwrap_or(0.0),
        ))
    };
    let (commits_a, fences_a) = committed(&a)?;
    let (commits_b, fences_b) = committed(&b)?;
    println!("commits a={commits_a} b={commits_b}, fences a={fences_a} b={fences_b}");
    ensure!(
        commits_a >= 2.0 && commits_b >= 2.0,
        "both agents commit: a={commits_a} b={commits_b}"
    );
    ensure!(
        fences_a + fences_b <= 2.0,
        "fences a={fences_a} b={fences_b}"
    );
    a.process.terminate()?;
    b.process.terminate()?;
    Ok(())
}

/// Waits until `agents` hold every partition in both pipelines, each some.
///
/// The test broker does not expire a killed member while a rebalance waits for it:
/// a member leaving before a killed one's session has expired can leave partitions
/// unassigned for minutes, with the agents polling and seeing no new assignment. Real
/// brokers expire members during a rebalance too. So membership changes come one at a
/// time here; records keep flowing throughout.
async fn settle(agents: &[&Agent], when: &str) -> Result<()> {
    for pipeline in ["append", "upsert"] {
        wait_assigned(agents, pipeline, PARTITIONS as f64, Duration::from_secs(90))
            .await
            .map_err(|e| anyhow::anyhow!("{pipeline} {when}: {e}"))?;
    }
    Ok(())
}

async fn wait_assigned(
    agents: &[&Agent],
    pipeline: &str,
    total: f64,
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let sum: f64 = agents
            .iter()
            .filter_map(|a| scrape_metrics(&a.metrics).ok())
            .filter_map(|m| {
                metric_value(
                    &m,
                    "floe_partitions_assigned",
                    &[&format!("pipeline=\"{pipeline}\"")],
                )
            })
            .sum();
        let each: Vec<f64> = agents
            .iter()
            .filter_map(|a| scrape_metrics(&a.metrics).ok())
            .map(|m| {
                metric_value(
                    &m,
                    "floe_partitions_assigned",
                    &[&format!("pipeline=\"{pipeline}\"")],
                )
                .unwrap_or(0.0)
            })
            .collect();
        if sum == total && each.iter().all(|x| *x > 0.0) {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("partitions assigned {each:?}, expected {total} in all");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A zombie: an agent paused (SIGSTOP) past its session timeout loses its partitions;
/// resumed (SIGCONT) with records it read before the pause, it cannot commit them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_resumed_after_its_session_cannot_commit() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("zombie", PARTITIONS).await?;
    let lake = scale_lake(false)?;
    let zombie = start_agent(&lake, &broker, "zombie", 1)?;
    wait_assigned(
        &[&zombie],
        "append",
        PARTITIONS as f64,
        Duration::from_secs(60),
    )
    .await?;
    let first: Vec<Message> = (0..600).map(message).collect();
    broker.produce("zombie", &first).await?;
    let catalog = lake.catalog().await?;
    wait_for_messages(
        catalog.as_ref(),
        "scale",
        "events",
        "append",
        600,
        Duration::from_secs(60),
    )
    .await?;
    // Paused with records in flight, past the session timeout: the group moves on.
    let more: Vec<Message> = (600..1200).map(message).collect();
    broker.produce("zombie", &more).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&zombie.process, "-STOP")?;
    let heir = start_agent(&lake, &broker, "zombie", 2)?;
    wait_for_messages(
        catalog.as_ref(),
        "scale",
        "events",
        "append",
        1200,
        Duration::from_secs(120),
    )
    .await?;
    let rest: Vec<Message> = (1200..1800).map(message).collect();
    broker.produce("zombie", &rest).await?;
    wait_for_messages(
        catalog.as_ref(),
        "scale",
        "events",
        "append",
        1800,
        Duration::from_secs(120),
    )
    .await?;
    // The zombie wakes up and tries to commit what it read before the pause.
    signal(&zombie.process, "-CONT")?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    check_tables(&lake, &broker, "zombie", 1800).await?;
    heir.process.terminate()?;
    let _ = zombie.process.terminate();
    Ok(())
}

/// The last lines of an agent's log (for failure messages).
/// The last lines of an agent's log without its routine commit lines (what is left
/// shows the group's assignments, fences and errors).
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            !l.contains(" committed pipeline=")
                && !l.contains("commit did not land")
                && !l.contains("another writer committed first")
        })
        .collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Produces `messages` to explicit partitions: `(partition, key, value)`.
async fn produce_to_partitions(
    bootstrap: &str,
    topic: &str,
    messages: &[(i32, Message)],
) -> Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let mut deliveries = Vec::new();
    for (partition, (key, value)) in messages {
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).partition(*partition);
        if let Some(k) = key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = value {
            record = record.payload(v.as_slice());
        }
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for d in deliveries {
        d.await?
            .map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
    }
    Ok(())
}

/// Maintenance on aggressive settings (every 2 s: compaction, expiry keeping 3
/// snapshots with no age grace) by two agents on one table. For a while only partition
/// 0 receives records, so the agent that does not own it stays quiet while the other's
/// commits and expiries delete every file of the table view it cached; then records
/// arrive for every partition and agents are killed and restarted. No pipeline stops,
/// and every value of both tables (append, and upsert on format v3 with deletion
/// vectors) is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_agents_survive_aggressive_maintenance_and_kills() -> Result<()> {
    let full = std::env::var_os("FLOE_SCALE_FULL").is_some_and(|v| v == "1");
    let (quiet_for, kills, rounds) = if full {
        (Duration::from_secs(60), 6, 30)
    } else {
        (Duration::from_secs(15), 2, 8)
    };
    let partitions = PARTITIONS;
    let broker = Broker::start()?;
    broker.create_topic("busy", partitions).await?;
    let lake = scale_lake(false)?;
    // Maintenance every 2 s: compaction, expiry keeping 3 snapshots with no age grace.
    let pipeline = |name: &str, table: &str, n: usize| {
        lake.pipeline(name, &broker.bootstrap, "busy", table)
            .property("session.timeout.ms", "6000")
            .property("heartbeat.interval.ms", "1000")
            .property("max.poll.interval.ms", "20000")
            .maintenance("interval", "2s")
            .maintenance("keep_snapshots", 3)
            .maintenance("max_snapshot_age", "0s")
            .maintenance("min_input_files", 2)
            .dead_letter(lake.ws.path(&format!("dead-letter-{name}-{n}.ndjson")))
    };
    let start = |n: usize| -> Result<Agent> {
        let metrics = format!("127.0.0.1:{}", free_port());
        let config = lake
            .config()
            .metrics(&metrics)
            .pipeline(pipeline("append", "events", n))
            .pipeline(
                pipeline("upsert", "latest", n)
                    .upsert(&["id"])
                    .set("sink.format_version", 3),
            );
        let path = lake.write(&format!("agent-{n}.toml"), &config)?;
        Ok(Agent {
            process: AgentProcess::start(&path, &[])?,
            metrics,
        })
    };
    // Record `seq` with key `id` goes to partition id % 12: a key's versions stay in order.
    let record = |seq: i64, id: i64| -> (i32, Message) {
        let value = json!({"seq": seq, "id": id, "version": seq, "at": format!("t{seq}")});
        (
            (id % i64::from(partitions)) as i32,
            (
                Some(format!("k{id}").into_bytes()),
                Some(value.to_string().into_bytes()),
            ),
        )
    };
    let mut agents = vec![start(1)?, start(2)?];
    settle(&[&agents[0], &agents[1]], "at start").await?;

    // Only partition 0 for a while (keys 0, 12, 24, ...): one agent stays quiet.
    let mut seq = 0i64;
    let quiet_until = Instant::now() + quiet_for;
    while Instant::now() < quiet_until {
        let batch: Vec<(i32, Message)> =
            (seq..seq + 40).map(|s| record(s, 12 * (s % 100))).collect();
        produce_to_partitions(&broker.bootstrap, "busy", &batch).await?;
        seq += 40;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Every partition now, with kills and restarts.
    let mut next = 3;
    for round in 0..rounds {
        let batch: Vec<(i32, Message)> = (seq..seq + 100).map(|s| record(s, s % 1200)).collect();
        produce_to_partitions(&broker.bootstrap, "busy", &batch).await?;
        seq += 100;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if kills > 0 && round % (rounds / kills).max(1) == 1 {
            let victim = agents.remove(round % agents.len());
            victim.process.kill9()?;
            agents.push(start(next)?);
            next += 1;
        }
    }
    let produced = seq;
    let refs: Vec<&Agent> = agents.iter().collect();
    settle(&refs, "after the kills").await?;
    let result = check_tables(&lake, &broker, "busy", produced).await;
    let mut stopped = Vec::new();
    for a in agents {
        let out = a.process.terminate().unwrap_or_else(|e| e.to_string());
        if out.contains("pipeline stopped") {
            stopped.push(tail(&out));
        }
    }
    ensure!(
        stopped.is_empty(),
        "a pipeline stopped:\n{}",
        stopped.join("\n---\n")
    );
    result
}
