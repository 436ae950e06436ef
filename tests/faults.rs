//! Fault injection against real services: each scenario runs the `floe` binary on a
//! continuous stream, injects one fault (broker unreachable or restarted, catalog
//! answering 503, S3 refusing connections, a full disk under the dead-letter file,
//! SIGKILL at random moments), and ends with both readers (PyIceberg, DuckDB) exact
//! against the reference: every produced record once, none lost, none twice, and every
//! column of every row equal to the record the broker holds (`floe_tests::reference`).
//!
//! CI runs the short version (faults of a few seconds, 3 kills). `scripts/faults.sh`
//! runs the full one (`FLOE_FAULTS_FULL=1`: 30 s outages, 60 s of 503, 20 kills) and
//! collects one JSON line per scenario and reader in `FLOE_FAULTS_REPORT`.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use floe_tests::faults::{FaultProxy, FaultyBroker, HttpFault, Moto, Producer};
use floe_tests::rest::{RestStack, TokenPolicy, WRITER};
use floe_tests::{AgentProcess, PipelineSpec, TableDump, Workspace};
use serde_json::json;

fn full() -> bool {
    std::env::var_os("FLOE_FAULTS_FULL").is_some_and(|v| v == "1")
}

/// `short` in CI, `long` in the full run.
fn pick<T>(short: T, long: T) -> T {
    if full() { long } else { short }
}

/// Records with id `i` for i in `range`, keyed over 10 keys (all partitions get some),
/// with a value of every inferred type (string, double, timestamp, list, struct).
fn records(range: std::ops::Range<i64>) -> Vec<floe_tests::Message> {
    range
        .map(|i| {
            let at =
                chrono::DateTime::from_timestamp(1_700_000_000 + i * 37, (i % 1000) as u32 * 1000)
                    .expect("timestamp")
                    .to_rfc3339();
            (
                Some(format!("k{}", i % 10).into_bytes()),
                Some(
                    json!({
                        "id": i,
                        "payload": format!("record {i}"),
                        "amount": i as f64 * 0.25 + 0.1,
                        "at": at,
                        "tags": [format!("t{}", i % 3), "all"],
                        "detail": {"n": i % 7, "even": i % 2 == 0},
                    })
                    .to_string()
                    .into_bytes(),
                ),
            )
        })
        .collect()
}

/// Lost and duplicated ids of `dump` against 0..n.
fn compare(dump: &TableDump, n: i64) -> (i64, i64) {
    let mut seen: BTreeMap<i64, i64> = BTreeMap::new();
    for row in dump.rows() {
        *seen.entry(row["id"].as_i64().expect("id")).or_default() += 1;
    }
    let lost = (0..n).filter(|i| !seen.contains_key(i)).count() as i64;
    let duplicated = seen.values().map(|c| c - 1).sum::<i64>()
        + seen.keys().filter(|i| !(0..n).contains(*i)).count() as i64;
    (lost, duplicated)
}

/// Appends a result line to `FLOE_FAULTS_REPORT` (if set).
fn report(fault: &str, tried: u32, survived: bool, reader: &str, lost: i64, duplicated: i64) {
    let Some(path) = std::env::var_os("FLOE_FAULTS_REPORT") else {
        return;
    };
    let line = json!({
        "fault": fault, "tried": tried, "survived": survived, "reader": reader,
        "lost": lost, "duplicated": duplicated, "full": full(),
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("report file");
    writeln!(f, "{line}").expect("report line");
}

/// Both readers exact against 0..n, each reported, and every column of every row equal
/// to the records of `topic` as the broker at `bootstrap` holds them.
fn assert_exact(
    fault: &str,
    tried: u32,
    reads: [(&str, Result<TableDump>); 2],
    n: i64,
    (bootstrap, topic): (&str, &str),
) -> Result<()> {
    let records =
        floe_tests::reference::read_topic(bootstrap, topic, n as usize, Duration::from_secs(120))?;
    let expected = floe_tests::reference::append_rows(&records);
    let mut problems = Vec::new();
    for (reader, dump) in reads {
        let dump = dump.with_context(|| format!("{reader} after {fault}"))?;
        let (lost, duplicated) = compare(&dump, n);
        report(fault, tried, true, reader, lost, duplicated);
        if lost != 0 || duplicated != 0 {
            problems.push(format!(
                "{reader}: {lost} lost, {duplicated} duplicated of {n}"
            ));
        }
        let diff = floe_tests::reference::diff_rows(
            &dump,
            &expected,
            &["_kafka_partition", "_kafka_offset"],
            &[],
        );
        if !diff.is_empty() {
            problems.push(format!("{reader}: values differ:\n  {}", diff.join("\n  ")));
        }
    }
    if !problems.is_empty() {
        bail!("{fault}: {}", problems.join("; "));
    }
    Ok(())
}

/// Produces `n` records in `batches` batches, `gap` apart (a continuous stream).
async fn stream(
    bootstrap: String,
    topic: &'static str,
    n: i64,
    batches: i64,
    gap: Duration,
) -> Result<()> {
    let producer = Producer::new(&bootstrap)?;
    let per = n / batches;
    for b in 0..batches {
        let end = if b == batches - 1 { n } else { (b + 1) * per };
        producer.produce(topic, &records(b * per..end)).await?;
        tokio::time::sleep(gap).await;
    }
    Ok(())
}

fn spec<'a>(name: &'a str, bootstrap: &'a str, topic: &'a str) -> PipelineSpec<'a> {
    PipelineSpec {
        name,
        bootstrap,
        topic,
        namespace: "faults",
        table: name,
        commit_interval: "1s",
    }
}

/// Waits for `n` rows, then a few commit intervals more (a duplicate would show), and
/// stops the agent cleanly.
async fn settle(
    ws: &Workspace,
    table: &str,
    n: i64,
    agent: AgentProcess,
    timeout: Duration,
) -> Result<()> {
    let waited = ws.wait_for_rows("faults", table, n, timeout).await;
    if let Err(e) = waited {
        bail!("{e}\nagent output:\n{}", agent.output());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    agent.terminate()?;
    Ok(())
}

fn read_both(ws: &Workspace, table: &str) -> [(&'static str, Result<TableDump>); 2] {
    [
        ("pyiceberg", ws.read("pyiceberg", "faults", table, "id")),
        ("duckdb", ws.read("duckdb", "faults", table, "id")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_unreachable_mid_stream() -> Result<()> {
    let outage = pick(Duration::from_secs(6), Duration::from_secs(30));
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("down", 3).await?;
    let ws = Workspace::new()?;
    let bootstrap = broker.bootstrap();
    let config = ws.write_config(&spec("down", &bootstrap, "down"))?;
    let n = 6_000;
    let agent = AgentProcess::start(&config, &[])?;
    let producer = tokio::spawn(stream(
        bootstrap.clone(),
        "down",
        n,
        20,
        Duration::from_millis(300),
    ));
    ws.wait_for_rows("faults", "down", 500, Duration::from_secs(90))
        .await?;
    // Every connection refused and the open ones dropped: the broker is gone.
    broker.proxy.refuse();
    tokio::time::sleep(outage).await;
    broker.proxy.restore()?;
    producer.await??;
    settle(&ws, "down", n, agent, Duration::from_secs(180)).await?;
    assert_exact(
        "broker unreachable",
        1,
        read_both(&ws, "down"),
        n,
        (&bootstrap, "down"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restarted_mid_stream() -> Result<()> {
    let moto = Moto::start()?;
    let broker = FaultyBroker::start(Some(&moto))?;
    broker.create_topic("restart", 3).await?;
    let ws = Workspace::new()?;
    let bootstrap = broker.bootstrap();
    let config = ws.write_config(&spec("restart", &bootstrap, "restart"))?;
    let n = 4_000;
    let agent = AgentProcess::start(&config, &[])?;
    broker.produce("restart", &records(0..n / 2)).await?;
    ws.wait_for_rows("faults", "restart", 200, Duration::from_secs(90))
        .await?;
    let restarts = pick(1, 3);
    for _ in 0..restarts {
        broker.restart(Duration::from_secs(pick(2, 10)))?;
    }
    broker.produce("restart", &records(n / 2..n)).await?;
    settle(&ws, "restart", n, agent, Duration::from_secs(240)).await?;
    assert_exact(
        "broker restarted",
        restarts,
        read_both(&ws, "restart"),
        n,
        (&bootstrap, "restart"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments() -> Result<()> {
    let kills = pick(3, 20);
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("kills", 3).await?;
    let ws = Workspace::new()?;
    let bootstrap = broker.bootstrap();
    let config = ws.write_config(&spec("kills", &bootstrap, "kills"))?;
    let n = i64::from(kills) * 1_500;
    let producer = tokio::spawn(stream(
        bootstrap.clone(),
        "kills",
        n,
        i64::from(kills) * 4,
        Duration::from_millis(400),
    ));
    let mut moments = Vec::new();
    for _ in 0..kills {
        let agent = AgentProcess::start(&config, &[])?;
        // A moment anywhere in start-up, reading, writing or committing.
        let ms = 300 + u64::from(random_u16()) % 4_000;
        moments.push(ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        agent.kill9()?;
    }
    producer.await??;
    let agent = AgentProcess::start(&config, &[])?;
    settle(&ws, "kills", n, agent, Duration::from_secs(240)).await?;
    eprintln!("killed after (ms): {moments:?}");
    assert_exact(
        "SIGKILL at random moments",
        kills,
        read_both(&ws, "kills"),
        n,
        (&bootstrap, "kills"),
    )
}

fn random_u16() -> u16 {
    let mut b = [0u8; 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("urandom");
    u16::from_le_bytes(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_under_the_dead_letter_file() -> Result<()> {
    let Some(disk) = floe_tests::faults::SmallDisk::mount(1024 * 1024)? else {
        eprintln!("SKIPPED: mounting a small tmpfs needs root");
        return Ok(());
    };
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("full", 1).await?;
    let ws = Workspace::new()?;
    let bootstrap = broker.bootstrap();
    let config = ws.write_config(&spec("full", &bootstrap, "full"))?;
    let dead_letters = disk.path.join("dead-letter.ndjson");
    let text = std::fs::read_to_string(&config)?.replace(
        &format!("path = \"{}/dead-letter.ndjson\"", ws.dir.path().display()),
        &format!("path = \"{}\"", dead_letters.display()),
    );
    std::fs::write(&config, text)?;
    // Good records 0..n; every tenth message is not JSON (3 KB each: the disk fills).
    let n = 400;
    let mut messages = Vec::new();
    let mut bad = 0;
    for i in 0..n {
        if i % 10 == 5 {
            messages.push((None, Some(vec![b'!'; 3000])));
            bad += 1;
        }
        messages.push(records(i..i + 1).remove(0));
    }
    broker.produce("full", &messages).await?;
    disk.fill()?;
    let mut agent = AgentProcess::start(&config, &[])?;
    // The pipeline stops with a clear message (the process may exit with it).
    if let Err(e) = agent.wait_for_line("no space left on the device", Duration::from_secs(120)) {
        let text = e.to_string();
        assert!(
            text.contains("no space left on the device"),
            "clear message:\n{text}"
        );
    }
    let _ = agent.kill9();
    // Nothing was committed past a record that could not be kept.
    let committed = ws.committed_rows("faults", "full").await?;
    assert!(
        committed < n,
        "{committed} rows committed with the disk full"
    );

    disk.free()?;
    let agent = AgentProcess::start(&config, &[])?;
    settle(&ws, "full", n, agent, Duration::from_secs(120)).await?;
    let letters = floe::dead_letter::DeadLetterWriter::read_all(&dead_letters)?;
    let mut offsets: Vec<i64> = letters.iter().map(|l| l.offset).collect();
    offsets.sort();
    offsets.dedup();
    assert_eq!(
        (letters.len(), offsets.len()),
        (bad as usize, bad as usize),
        "every bad record dead-lettered once"
    );
    assert_exact(
        "disk full (dead-letter file)",
        1,
        read_both(&ws, "full"),
        n,
        (&bootstrap, "full"),
    )
}

/// A REST pipeline: the agent reaches the catalog through `catalog_uri` and S3 through
/// `s3_endpoint`.
fn rest_config(
    stack: &RestStack,
    dir: &std::path::Path,
    bootstrap: &str,
    topic: &str,
    catalog_uri: &str,
    s3_endpoint: &str,
) -> Result<std::path::PathBuf> {
    let catalog = stack
        .catalog_toml("lake", WRITER)
        .replace(&stack.uri, catalog_uri)
        .replace(
            &format!("s3.endpoint = \"{}\"", stack.s3_endpoint),
            &format!("s3.endpoint = \"{s3_endpoint}\""),
        );
    let text = format!(
        "{catalog}\n{}",
        floe_tests::rest::pipeline_toml(topic, bootstrap, topic, "lake", ("faults", topic), dir)
    );
    let path = dir.join(format!("{topic}.toml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

async fn rest_rows(stack: &RestStack, table: &str) -> Result<i64> {
    let catalog = stack.open_catalog(WRITER).await?;
    floe_tests::committed_rows(catalog.as_ref(), "faults", table).await
}

/// Waits (up to 120 s) until the REST table holds `at_least` rows; else fails with
/// `what` and the agent's log.
async fn wait_rest_rows(
    stack: &RestStack,
    table: &str,
    at_least: i64,
    agent: &AgentProcess,
    what: &str,
) -> Result<()> {
    let start = Instant::now();
    while rest_rows(stack, table).await.unwrap_or(0) < at_least {
        if start.elapsed() > Duration::from_secs(120) {
            bail!("{what}:\n{}", agent.output());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

async fn rest_settle(
    stack: &RestStack,
    table: &str,
    n: i64,
    agent: AgentProcess,
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let rows = rest_rows(stack, table).await.unwrap_or(0);
        if rows >= n {
            break;
        }
        if start.elapsed() > timeout {
            bail!(
                "{rows} of {n} rows after {timeout:?}\nagent output:\n{}",
                agent.output()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    agent.terminate()?;
    Ok(())
}

fn rest_read_both(stack: &RestStack, table: &str) -> [(&'static str, Result<TableDump>); 2] {
    [
        ("pyiceberg", stack.read("pyiceberg", "faults", table, "id")),
        ("duckdb", stack.read("duckdb", "faults", table, "id")),
    ]
}

/// Sum of the offsets the newest snapshot stores.
async fn committed_offsets(stack: &RestStack, table: &str) -> Result<i64> {
    let catalog = stack.open_catalog(WRITER).await?;
    let t = catalog
        .load_table(&iceberg::TableIdent::from_strs(["faults", table])?)
        .await?;
    let offsets = floe_iceberg::OffsetMap::from_table(t.metadata(), table)?;
    Ok(offsets.0.values().sum())
}

/// Sum of the offsets stored by the first snapshot committed after `after`, if any.
async fn first_snapshot_after(
    stack: &RestStack,
    table: &str,
    after: std::time::SystemTime,
) -> Result<Option<i64>> {
    let catalog = stack.open_catalog(WRITER).await?;
    let t = catalog
        .load_table(&iceberg::TableIdent::from_strs(["faults", table])?)
        .await?;
    let after_ms = after.duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let first = t
        .metadata()
        .snapshots()
        .filter(|s| s.timestamp_ms() >= after_ms)
        .min_by_key(|s| s.timestamp_ms());
    Ok(first.and_then(|s| {
        let text = s.summary().additional_properties.get("floe.offsets")?;
        let map = floe_iceberg::OffsetMap::from_summary_value(text).ok()?;
        Some(map.0.values().sum())
    }))
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The catalog answers 503 to everything for several commit intervals while records
/// keep coming: nothing lost or duplicated, memory flat (files wait in storage), and one
/// commit covers the outage when the catalog is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_answers_503() -> Result<()> {
    let outage = pick(Duration::from_secs(8), Duration::from_secs(60));
    let stack = RestStack::start(TokenPolicy::default())?;
    let catalog = FaultProxy::http(
        stack
            .uri
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap(),
    )?;
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("c503", 3).await?;
    let dir = tempfile::tempdir()?;
    let uri = stack.uri.replacen(
        stack
            .uri
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap(),
        &catalog.address(),
        1,
    );
    let config = rest_config(
        &stack,
        dir.path(),
        &broker.bootstrap(),
        "c503",
        &uri,
        &stack.s3_endpoint,
    )?;
    let n = 4_000;
    let agent = AgentProcess::start(&config, &[])?;
    let producer = tokio::spawn(stream(
        broker.bootstrap(),
        "c503",
        n,
        16,
        Duration::from_millis(400),
    ));
    wait_rest_rows(&stack, "c503", 200, &agent, "no rows before the fault").await?;
    let before = committed_offsets(&stack, "c503").await?;
    // Every catalog request (tokens included) answers 503 for the whole outage.
    catalog.inject(HttpFault::status("/", 503).for_duration(outage));
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < outage {
        rss.push(rss_mib(agent.pid()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ended = std::time::SystemTime::now();
    assert!(
        catalog.injected() > 0,
        "the agent asked the catalog during the outage"
    );
    // The files written during the outage land in one commit when the catalog is back:
    // the first snapshot after it moves the offsets past what was read during the
    // outage (the producer sends 40 records a second; allow for the last interval).
    let first_after = loop {
        if let Some(s) = first_snapshot_after(&stack, "c503", ended).await? {
            break s;
        }
        ensure!(
            started.elapsed() < outage + Duration::from_secs(90),
            "no commit after the outage:\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let caught_up = first_after - before;
    let read_in_outage = (outage.as_secs() as i64 - 3) * 40;
    println!(
        "catalog outage of {outage:?}: first commit after it moved {caught_up} offsets; agent RSS during it (MiB): {rss:?}"
    );
    ensure!(
        caught_up >= read_in_outage,
        "the first commit after the outage moved only {caught_up} offsets (expected >= {read_in_outage})"
    );
    let (low, high) = (
        rss.iter().copied().fold(f64::MAX, f64::min),
        rss.iter().copied().fold(0.0, f64::max),
    );
    ensure!(
        high < low * 2.0 + 64.0,
        "RSS grew during the outage: {rss:?}"
    );
    producer.await??;
    rest_settle(&stack, "c503", n, agent, Duration::from_secs(240)).await?;
    assert_exact(
        "catalog 503",
        1,
        rest_read_both(&stack, "c503"),
        n,
        (&broker.bootstrap(), "c503"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_conflict_then_failing_loads_are_retried() -> Result<()> {
    let stack = RestStack::start(TokenPolicy::default())?;
    let host = stack
        .uri
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let catalog = FaultProxy::http(&host)?;
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("conflict", 1).await?;
    let dir = tempfile::tempdir()?;
    let uri = stack.uri.replacen(&host, &catalog.address(), 1);
    let config = rest_config(
        &stack,
        dir.path(),
        &broker.bootstrap(),
        "conflict",
        &uri,
        &stack.s3_endpoint,
    )?;
    broker.produce("conflict", &records(0..100)).await?;
    let agent = AgentProcess::start(&config, &[])?;
    wait_rest_rows(&stack, "conflict", 100, &agent, "first rows").await?;
    // The next commit is answered 409 (another writer won), and the loads that follow 503.
    catalog.inject(
        HttpFault::status("/tables/conflict", 409)
            .method("POST")
            .times(1),
    );
    catalog.inject(
        HttpFault::status("/tables/conflict", 503)
            .method("GET")
            .times(3),
    );
    broker.produce("conflict", &records(100..200)).await?;
    rest_settle(&stack, "conflict", 200, agent, Duration::from_secs(120)).await?;
    assert_eq!(catalog.injected(), 4, "{:?}", catalog.requests());
    assert_exact(
        "commit 409 then load 503",
        1,
        rest_read_both(&stack, "conflict"),
        200,
        (&broker.bootstrap(), "conflict"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_refuses_connections_mid_upload() -> Result<()> {
    let outage = pick(Duration::from_secs(6), Duration::from_secs(30));
    let stack = RestStack::start(TokenPolicy::default())?;
    let s3 = FaultProxy::tcp(stack.s3_endpoint.trim_start_matches("http://"))?;
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("s3down", 3).await?;
    let dir = tempfile::tempdir()?;
    let config = rest_config(
        &stack,
        dir.path(),
        &broker.bootstrap(),
        "s3down",
        &stack.uri,
        &s3.url(),
    )?;
    let n = 4_000;
    let agent = AgentProcess::start(&config, &[])?;
    let producer = tokio::spawn(stream(
        broker.bootstrap(),
        "s3down",
        n,
        16,
        Duration::from_millis(400),
    ));
    wait_rest_rows(&stack, "s3down", 200, &agent, "no rows before the fault").await?;
    s3.refuse();
    tokio::time::sleep(outage).await;
    s3.restore()?;
    producer.await??;
    rest_settle(&stack, "s3down", n, agent, Duration::from_secs(240)).await?;
    assert_exact(
        "S3 refusing connections",
        1,
        rest_read_both(&stack, "s3down"),
        n,
        (&broker.bootstrap(), "s3down"),
    )
}
