//! `floe-bench`: throughput, CPU per record and memory of Floe, side by side with the
//! limits around it and with a peer a user would write instead.
//!
//! Workload (like OLake's public Kafka benchmark): JSON records of about 134 bytes,
//! produced to a real local broker before timing starts. Scenarios:
//! (a) the broker read-only rate with rdkafka (the Kafka-side limit);
//! (b) JSON -> Arrow -> Parquet -> Iceberg commit on the same records without Kafka;
//! (b') the same in upsert mode keyed by `id` (ids repeat: key index, position deletes);
//! (c) Floe, no plugin; (d) Floe with 1 and 3 passthrough plugins and with a real chain
//! (filter + redact + rename) (the `floe` binary, measured from outside: CPU from
//! /proc, peak RSS from VmHWM);
//! (e) a Python consumer (confluent-kafka) batching into pyarrow and appending with PyIceberg;
//! (f) a long-lived upsert table (1,000 commits over 10k keys), maintenance off vs on
//! (`maintenance.rs`; alone with `--only-maintenance`);
//! (g) with `--agents`, 1, 2 and 3 `floe` processes in one consumer group on one table.
//!
//! The `floe` scenarios run `--rounds` times in turn (default 3); each plugin ratio to
//! (c) is the median of the rounds' own ratios, every round's figures are printed.
//!
//! Run with `scripts/bench.sh` (builds in release, installs tools, prints a table and
//! writes JSON).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use floe::sink::TableSink;
use floe_iceberg::{CatalogConfig, open_catalog};
use floe_tests::{Broker, Message, Workspace, free_port, metric_value, scrape_metrics};
use iceberg::{Catalog, TableIdent};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{Value, json};

mod maintenance;
mod sizes;

#[derive(Parser)]
struct Args {
    /// Records to produce and ingest.
    #[arg(long, default_value_t = 1_000_000)]
    records: usize,
    /// Topic partitions.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench-results.json")]
    out: PathBuf,
    /// Skip the Python peer.
    #[arg(long)]
    skip_peer: bool,
    /// Commits of the long-table scenario (f).
    #[arg(long, default_value_t = 1000)]
    maintenance_commits: usize,
    /// Keys of the long-table scenario (f).
    #[arg(long, default_value_t = 10_000)]
    maintenance_keys: u64,
    /// Scenario (f): a commit starts at most every this many milliseconds.
    #[arg(long, default_value_t = 50)]
    maintenance_pace_ms: u64,
    /// Run only scenario (f).
    #[arg(long)]
    only_maintenance: bool,
    /// Skip scenario (f).
    #[arg(long)]
    skip_maintenance: bool,
    /// Rounds of the `floe run` scenarios: each round runs (c) and every (d) in turn, and
    /// each plugin ratio is the median of the rounds' own ratios (the machine's speed
    /// drifts within minutes, so a ratio is taken between runs a few seconds apart).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `commit_interval` of the `floe run` scenarios (c) and (d).
    #[arg(long, default_value = "10s")]
    commit_interval: String,
    /// `transform_threads` of the `floe run` scenarios (c) and (d); unset, the agent's
    /// default (one less than the cores, 1 to 4).
    #[arg(long)]
    transform_threads: Option<usize>,
    /// Also run 1, 2 and 3 agents (separate processes, one consumer group) on one table.
    #[arg(long)]
    agents: bool,
    /// Run only the agents scenario (with --agents).
    #[arg(long)]
    only_agents: bool,
    /// Run only the message-size scenario: these sizes (e.g. `1KiB,100KiB,1MiB,10MiB`)
    /// through one passthrough plugin.
    #[arg(long)]
    sizes: Option<String>,
    /// Bytes produced per size in the message-size scenario.
    #[arg(long, default_value_t = 256 << 20)]
    sizes_total: u64,
    /// Diagnose: read an existing topic at this broker with Floe's consumer settings
    /// (subscribe) and with plain assign, print both rates, and stop.
    #[arg(long)]
    read_test: Option<String>,
}

/// One scenario's figures.
#[derive(Debug, Clone, serde::Serialize)]
struct Figures {
    scenario: String,
    records: usize,
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_mib: Option<f64>,
    files: Option<i64>,
    snapshots: Option<i64>,
    bytes: u64,
    /// For the `floe` runs: seconds from process start to the first record read (not in `seconds`).
    startup_seconds: Option<f64>,
    /// For the `floe` runs: which round (from 1).
    round: Option<usize>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }
    fn cpu_per_million(&self) -> f64 {
        self.cpu_seconds / (self.records as f64 / 1e6)
    }
    fn per_core(&self) -> f64 {
        self.records as f64 / self.cpu_seconds
    }
}

fn record(i: usize) -> Value {
    const EVENTS: [&str; 5] = ["page_view", "click", "signup", "purchase", "logout"];
    json!({
        "id": i,
        "user": format!("user-{}@example.com", (i * 7919) % 100_000),
        "event": EVENTS[i % 5],
        "amount": (i % 10_000) as f64 / 100.0,
        "ts": format!("2024-01-01T{:02}:{:02}:{:02}.{:06}Z", (i / 3600) % 24, (i / 60) % 60, i % 60, i % 1_000_000),
        "tags": ["beta", "web"],
    })
}

/// CPU seconds (user + system) of a process, from /proc.
fn cpu_seconds(pid: &str) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = &stat[stat.rfind(')').context("stat format")? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / clock_ticks())
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// This process's resident memory now, in MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

async fn table_stats(catalog: &Arc<dyn Catalog>, ident: &TableIdent) -> Result<(i64, i64, i64)> {
    let table = catalog.load_table(ident).await?;
    let meta = table.metadata();
    let snapshots = meta.snapshots().count() as i64;
    let summary = |k: &str| {
        meta.current_snapshot()
            .and_then(|s| {
                s.summary()
                    .additional_properties
                    .get(k)
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    };
    Ok((
        summary("total-records"),
        summary("total-data-files"),
        snapshots,
    ))
}

/// (a) How fast rdkafka reads the topic with nothing else to do.
fn read_only(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    n: usize,
    bytes: u64,
) -> Result<Figures> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .set("group.id", "bench-read-only")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let cpu0 = cpu_seconds("self")?;
    let start = Instant::now();
    let mut seen = 0;
    let mut payload_bytes = 0usize;
    while seen < n {
        if let Some(m) = consumer.poll(Duration::from_secs(5)) {
            let m = m?;
            payload_bytes += m.payload_len();
            seen += 1;
        } else if start.elapsed() > Duration::from_secs(300) {
            bail!("read only {seen} of {n}");
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box(payload_bytes);
    Ok(Figures {
        scenario: "a: broker read-only (rdkafka)".into(),
        records: n,
        seconds,
        cpu_seconds: cpu_seconds("self")? - cpu0,
        peak_rss_mib: None,
        files: None,
        snapshots: None,
        bytes,
        startup_seconds: None,
        round: None,
    })
}

/// (b) The real pipeline in-process without Kafka: decode, infer, encode to Arrow, write
/// Parquet and commit, fed from memory by a scripted source.
/// With `upsert`: the same in upsert mode keyed by `id` (values repeat ids), which adds
/// the key index, last-per-key reduction and position-delete files.
async fn encode_limit(values: &[Vec<u8>], upsert: bool) -> Result<Figures> {
    let ws = Workspace::new()?;
    let d = ws.dir.path().display();
    let mode = if upsert {
        format!(
            "mode = \"upsert\"\nkey = [\"id\"]\nindex_dir = \"{}\"\n",
            ws.path("index").display()
        )
    } else {
        String::new()
    };
    let config = format!(
        r#"[catalogs.local]
type = "embedded"
path = "{d}/catalog.db"
warehouse = "{d}/warehouse"
[[pipelines]]
name = "bench"
[pipelines.source]
bootstrap_servers = "unused:9092"
group_id = "unused"
topics = ["bench"]
[pipelines.sink]
catalog = "local"
namespace = "bench"
table = "encode"
create_table = true
commit_interval = "600s"
{mode}"#
    );
    let path = ws.path("floe.toml");
    std::fs::write(&path, config)?;
    let topic: Arc<str> = Arc::from("bench");
    let messages: Vec<Vec<floe::record::Message>> = values
        .chunks(4096)
        .enumerate()
        .map(|(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .map(|(i, v)| floe::record::Message {
                    topic: topic.clone(),
                    partition: 0,
                    offset: (c * 4096 + i) as i64,
                    timestamp_ms: Some(0),
                    key: None,
                    value: Some(v.clone()),
                    headers: Vec::new(),
                })
                .collect()
        })
        .collect();
    let cpu0 = cpu_seconds("self")?;
    let start = Instant::now();
    let pipeline = floe_tests::scripted::ScriptedPipeline::start(&path).await?;
    pipeline.assign("bench", &[(0, None, vec![None])]);
    for batch in messages {
        pipeline.push(batch);
        // Keep a bounded backlog, like the source's channel does.
        while pipeline.script.pending() > 8 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    pipeline.stop().await??;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds("self")? - cpu0;
    let catalog = ws.catalog().await?;
    let ident = TableIdent::from_strs(["bench", "encode"])?;
    let (rows, files, snapshots) = table_stats(&catalog, &ident).await?;
    if upsert {
        // Rebuilding the key index from the table is what a restart costs.
        let handle = open_catalog(
            "local",
            &CatalogConfig::embedded(ws.path("catalog.db"), ws.path("warehouse")),
        )
        .await?;
        let mut sink_config: floe::sink::SinkConfig = toml_sink();
        sink_config.mode = floe::sink::Mode::Upsert;
        sink_config.key = vec!["id".into()];
        // A directory with no index in it: the index is read from the table.
        sink_config.index_dir = ws.path("rebuild");
        let rss0 = rss_mib();
        let started = Instant::now();
        let reopened = TableSink::open(&handle, &sink_config, "encode", "bench", "bench").await?;
        println!(
            "upsert index rebuild: {:.2} s, process RSS +{:.0} MiB",
            started.elapsed().as_secs_f64(),
            rss_mib() - rss0
        );
        drop(reopened);
        // The pipeline's own directory: the index it kept at its stop.
        sink_config.index_dir = ws.path("index");
        let started = Instant::now();
        let reopened = TableSink::open(&handle, &sink_config, "encode", "bench", "bench").await?;
        println!(
            "upsert index opened from disk: {:.2} s",
            started.elapsed().as_secs_f64()
        );
        drop(reopened);
    } else {
        anyhow::ensure!(
            rows as usize == values.len(),
            "encode limit wrote {rows} rows"
        );
    }
    let bytes = values.iter().map(|v| v.len() as u64).sum();
    Ok(Figures {
        scenario: if upsert {
            "b': the same in upsert mode (ids repeat 10x; key index + position deletes)".into()
        } else {
            "b: the pipeline in-process, no Kafka (scripted source)".into()
        },
        records: values.len(),
        seconds,
        cpu_seconds: cpu,
        peak_rss_mib: None,
        files: Some(files),
        snapshots: Some(snapshots),
        bytes,
        startup_seconds: None,
        round: None,
    })
}

fn toml_sink() -> floe::sink::SinkConfig {
    toml::from_str(
        "catalog = \"local\"\nnamespace = \"bench\"\ntable = \"encode\"\ncreate_table = true",
    )
    .expect("sink config")
}

/// (c)/(d) The `floe` binary ingesting the topic, measured from outside.
/// One `floe run` scenario: the plugin chain (plugin, its `with` table) and which of
/// the workload's 5 events (record `i` has event `i % 5`) it keeps.
struct Run {
    scenario: &'static str,
    chain: &'static [(&'static str, &'static str)],
    kept: &'static [usize],
}

const PASS: (&str, &str) = ("passthrough", "");
/// A real chain: keep 3 of the 5 events, drop `tags` and hash `user`, rename two fields.
const CHAIN: [(&str, &str); 3] = [
    (
        "filter",
        r#"all = [{ field = "event", op = "in", value = ["page_view", "click", "purchase"] }]"#,
    ),
    (
        "redact",
        "drop = [\"tags\"]\nhash = [\"user\"]\nsalt = \"pepper\"",
    ),
    (
        "rename",
        r#"fields = { ts = "event_time", amount = "amount_eur" }"#,
    ),
];

const RUNS: [Run; 4] = [
    Run {
        scenario: "c: floe, no plugin",
        chain: &[],
        kept: &[0, 1, 2, 3, 4],
    },
    Run {
        scenario: "d: floe, 1 passthrough plugin",
        chain: &[PASS],
        kept: &[0, 1, 2, 3, 4],
    },
    Run {
        scenario: "d: floe, 3 passthrough plugins",
        chain: &[PASS, PASS, PASS],
        kept: &[0, 1, 2, 3, 4],
    },
    Run {
        scenario: "d: floe, filter + redact + rename",
        chain: &CHAIN,
        kept: &[0, 1, 3],
    },
];

/// Pipeline settings of the `floe run` scenarios, from the command line.
struct Tuning {
    commit_interval: String,
    transform_threads: Option<usize>,
}

async fn floe_run(
    name: &str,
    broker: &Broker,
    topic: &str,
    n: usize,
    bytes: u64,
    run: &Run,
    tuning: &Tuning,
) -> Result<Figures> {
    let ws = Workspace::new()?;
    let commit_interval = &tuning.commit_interval;
    let threads = tuning
        .transform_threads
        .map(|n| format!("transform_threads = {n}\n"))
        .unwrap_or_default();
    let metrics = format!("127.0.0.1:{}", free_port());
    let d = ws.dir.path().display();
    let mut config = format!(
        r#"[metrics]
listen = "{metrics}"
[plugins]
cache_dir = "{cache}"
[catalogs.local]
type = "embedded"
path = "{d}/catalog.db"
warehouse = "{d}/warehouse"
[[pipelines]]
name = "bench"
{threads}[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{name}"
topics = ["{topic}"]
[pipelines.source.properties]
"session.timeout.ms" = "6000"
"fetch.max.bytes" = "52428800"
[pipelines.sink]
catalog = "local"
namespace = "bench"
table = "events"
create_table = true
commit_interval = "{commit_interval}"
"#,
        cache = std::env::temp_dir().join("floe-bench-wasm-cache").display(),
        bootstrap = broker.bootstrap,
    );
    for (plugin, with) in run.chain {
        config.push_str(&format!(
            "[[pipelines.transforms]]\nuses = \"{}\"\n[pipelines.transforms.with]\n{with}\n",
            floe_tests::plugin_path(plugin).display()
        ));
    }
    let path = ws.path("floe.toml");
    std::fs::write(&path, config)?;
    let bin = floe_tests::floe_bin();
    let start = Instant::now();
    let mut child = Command::new(&bin)
        .args(["run", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(ws.path("floe.log"))?)
        .spawn()?;
    let pid = child.id();
    let mut peak = 0.0f64;
    let mut first_read: Option<Instant> = None;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "floe exited early ({status}): {}",
                std::fs::read_to_string(ws.path("floe.log"))?
            );
        }
        peak = peak.max(peak_rss_mib(pid).unwrap_or(0.0));
        let read = scrape_metrics(&metrics)
            .ok()
            .and_then(|m| metric_value(&m, "floe_records_in_total", &[]))
            .unwrap_or(0.0);
        if read > 0.0 && first_read.is_none() {
            first_read = Some(Instant::now());
        }
        if read as usize >= n {
            break;
        }
        if start.elapsed() > Duration::from_secs(900) {
            bail!("floe read {read} of {n} records in 900s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Everything is read: a graceful stop commits the rest, and the clock stops at exit.
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    let mut cpu = 0.0;
    loop {
        peak = peak.max(peak_rss_mib(pid).unwrap_or(0.0));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if let Ok(c) = cpu_seconds(&pid.to_string()) {
            cpu = c;
        }
        // A zombie keeps its CPU times until it is reaped.
        if stat.contains(") Z ") || stat.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Throughput counts from the first record read to the exit after the last commit;
    // startup (catalog, plugins, consumer-group join) is reported on its own.
    let first_read = first_read.unwrap_or(start);
    let seconds = first_read.elapsed().as_secs_f64();
    let startup_seconds = Some((first_read - start).as_secs_f64());
    let status = child.wait()?;
    anyhow::ensure!(
        status.success(),
        "floe failed: {}",
        std::fs::read_to_string(ws.path("floe.log"))?
    );
    let catalog = ws.catalog().await?;
    let (rows, files, snapshots) =
        table_stats(&catalog, &TableIdent::from_strs(["bench", "events"])?).await?;
    let expected = (0..n).filter(|i| run.kept.contains(&(i % 5))).count();
    anyhow::ensure!(
        rows as usize == expected,
        "floe committed {rows} of {expected} rows"
    );
    Ok(Figures {
        scenario: run.scenario.to_string(),
        records: n,
        seconds,
        cpu_seconds: cpu,
        peak_rss_mib: Some(peak),
        files: Some(files),
        snapshots: Some(snapshots),
        bytes,
        startup_seconds,
        round: None,
    })
}

/// (g) `agents` `floe` processes in one consumer group on one table: wall time from the
/// first record read to every message covered by the table's offsets, CPU of all agents
/// together, and the fences and commit retries they counted.
async fn agents_run(
    broker: &Broker,
    topic: &str,
    n: usize,
    bytes: u64,
    agents: usize,
) -> Result<Figures> {
    let ws = Workspace::new()?;
    let d = ws.dir.path().display();
    let mut children = Vec::new();
    let mut endpoints = Vec::new();
    let start = Instant::now();
    for a in 0..agents {
        let metrics = format!("127.0.0.1:{}", free_port());
        let config = format!(
            r#"[metrics]
listen = "{metrics}"
[catalogs.local]
type = "embedded"
path = "{d}/catalog.db"
warehouse = "{d}/warehouse"
[[pipelines]]
name = "bench"
[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "bench-agents-{agents}"
topics = ["{topic}"]
[pipelines.source.properties]
"session.timeout.ms" = "6000"
"fetch.max.bytes" = "52428800"
[pipelines.sink]
catalog = "local"
namespace = "bench"
table = "events"
create_table = true
commit_interval = "10s"
"#,
            bootstrap = broker.bootstrap,
        );
        let path = ws.path(&format!("floe-{a}.toml"));
        std::fs::write(&path, config)?;
        let child = Command::new(floe_tests::floe_bin())
            .args(["run", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(ws.path(&format!("floe-{a}.log")))?)
            .spawn()?;
        children.push(child);
        endpoints.push(metrics);
    }
    let catalog = ws.catalog().await?;
    let mut first_read: Option<Instant> = None;
    let mut cpu = vec![0.0; agents];
    loop {
        for (i, c) in children.iter().enumerate() {
            if let Ok(v) = cpu_seconds(&c.id().to_string()) {
                cpu[i] = v;
            }
        }
        if first_read.is_none() {
            let read: f64 = endpoints
                .iter()
                .filter_map(|m| scrape_metrics(m).ok())
                .filter_map(|m| metric_value(&m, "floe_records_in_total", &[]))
                .sum();
            if read > 0.0 {
                first_read = Some(Instant::now());
            }
        }
        let covered =
            floe_tests::covered_messages(catalog.as_ref(), "bench", "events", "bench").await?;
        if covered as usize >= n {
            break;
        }
        if start.elapsed() > Duration::from_secs(900) {
            bail!("{agents} agents covered {covered} of {n} in 900s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = first_read.unwrap_or(start).elapsed().as_secs_f64();
    let counter = |name: &str| -> f64 {
        endpoints
            .iter()
            .filter_map(|m| scrape_metrics(m).ok())
            .filter_map(|m| metric_value(&m, name, &[]))
            .sum()
    };
    let fences = counter("floe_fences_total");
    let retries = counter("floe_commit_retries_total");
    for c in &children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
    }
    for mut c in children {
        let _ = c.wait();
    }
    let (rows, files, snapshots) =
        table_stats(&catalog, &TableIdent::from_strs(["bench", "events"])?).await?;
    anyhow::ensure!(
        rows as usize == n,
        "{agents} agents committed {rows} of {n} rows"
    );
    println!("{agents} agent(s): fences {fences}, commit retries {retries}");
    Ok(Figures {
        scenario: format!(
            "g: floe, {agents} agent(s) on one table (fences {fences}, retries {retries})"
        ),
        records: n,
        seconds,
        cpu_seconds: cpu.iter().sum(),
        peak_rss_mib: None,
        files: Some(files),
        snapshots: Some(snapshots),
        bytes,
        startup_seconds: None,
        round: None,
    })
}

/// (e) The Python peer (`tests/bench/peer.py`).
fn python_peer(broker: &Broker, topic: &str, n: usize, bytes: u64) -> Result<Figures> {
    let ws = Workspace::new()?;
    let python =
        std::env::var("FLOE_PYTHON").context("FLOE_PYTHON not set: run scripts/bench.sh")?;
    let out = Command::new(python)
        .arg(floe_tests::repo_root().join("tests/bench/peer.py"))
        .args([
            "--bootstrap",
            &broker.bootstrap,
            "--topic",
            topic,
            "--records",
            &n.to_string(),
            "--commit-interval",
            "10",
            "--flush-bytes",
            &(32 << 20).to_string(),
        ])
        .arg("--workdir")
        .arg(ws.dir.path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(Figures {
        scenario: "e: Python peer (confluent-kafka + pyarrow + PyIceberg)".into(),
        records: v["records"].as_u64().unwrap_or(0) as usize,
        seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
        cpu_seconds: v["cpu_seconds"].as_f64().unwrap_or(f64::NAN),
        peak_rss_mib: v["peak_rss_mib"].as_f64(),
        files: v["files"].as_i64(),
        snapshots: v["snapshots"].as_i64(),
        bytes,
        startup_seconds: None,
        round: None,
    })
}

fn print_table(results: &[Figures]) {
    println!(
        "\n{:<52} {:>10} {:>9} {:>9} {:>12} {:>13} {:>9} {:>6} {:>6}",
        "scenario",
        "records/s",
        "MB/s",
        "wall s",
        "CPU s/1M",
        "rec/CPU-s",
        "RSS MiB",
        "files",
        "snaps"
    );
    for f in results {
        let label = match f.round {
            Some(r) => format!("{} (round {r})", f.scenario),
            None => f.scenario.clone(),
        };
        println!(
            "{:<52} {:>10.0} {:>9.1} {:>9.2} {:>12.2} {:>13.0} {:>9} {:>6} {:>6} {:>9}",
            label,
            f.rate(),
            f.mb_per_s(),
            f.seconds,
            f.cpu_per_million(),
            f.per_core(),
            f.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}")),
            f.files.map_or("-".into(), |x| x.to_string()),
            f.snapshots.map_or("-".into(), |x| x.to_string()),
            f.startup_seconds.map_or("-".into(), |x| format!("{x:.2}")),
        );
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `--read-test BROKER`: Floe's consumer settings vs a plain consumer on topic `bench`.
fn read_test(bootstrap: &str, n: usize, partitions: i32) -> Result<()> {
    let source: floe::source::SourceConfig = toml::from_str(&format!(
        "bootstrap_servers = \"{bootstrap}\"\ngroup_id = \"read-test-{}\"\ntopics = [\"bench\"]",
        std::process::id()
    ))?;
    for (name, subscribe, mut config) in [
        ("floe settings, subscribe", true, source.client_config()),
        ("floe settings, assign", false, source.client_config()),
        ("plain, assign", false, {
            let mut c = ClientConfig::new();
            c.set("bootstrap.servers", bootstrap)
                .set("group.id", "read-test-plain")
                .set("enable.auto.commit", "false");
            c
        }),
    ] {
        config.set(
            "group.id",
            format!("read-test-{}-{}", std::process::id(), name.len()),
        );
        let consumer: BaseConsumer = config.create()?;
        if subscribe {
            consumer.subscribe(&["bench"])?;
        } else {
            let mut tpl = TopicPartitionList::new();
            for p in 0..partitions {
                tpl.add_partition_offset("bench", p, Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
        }
        let mut seen = 0;
        let mut first = None;
        let mut stalls = 0;
        let mut last = Instant::now();
        while seen < n {
            if let Some(m) = consumer.poll(Duration::from_secs(5)) {
                m?;
                seen += 1;
                let now = Instant::now();
                if first.is_none() {
                    first = Some(now);
                } else if now - last > Duration::from_millis(200) {
                    stalls += 1;
                }
                last = now;
            }
        }
        let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        println!(
            "{name}: {n} in {secs:.2} s = {:.0}/s, {stalls} stalls over 200 ms",
            n as f64 / secs
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(b) = &args.read_test {
        return read_test(b, args.records, args.partitions);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

/// Memory of the upsert key index at its default budget: resident bytes per live key
/// for `keys` keys.
async fn index_memory(keys: usize) -> Result<()> {
    let before = rss_mib();
    let settings = floe::sink::upsert::IndexSettings::temporary(256 << 20);
    let mut index = floe::sink::upsert::KeyIndex::new(settings)?;
    let started = Instant::now();
    let empty = iceberg::spec::Struct::empty();
    for k in 0..keys as u128 {
        // Digests are uniform: spread the test keys like xxh3 would.
        let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        let file = index.register_file(&format!("data-{}.parquet", k / 100_000), 0, &empty);
        index.put(key, file, (k % 100_000) as u64)?;
        if k % 100_000 == 0 {
            index.maintain().await?;
        }
    }
    let mib = rss_mib() - before;
    println!(
        "upsert key index: {keys} keys, +{mib:.0} MiB resident = {:.0} bytes/key, built in {:.2} s",
        mib * 1024.0 * 1024.0 / keys as f64,
        started.elapsed().as_secs_f64()
    );
    drop(index);
    Ok(())
}

/// Scenario (f) off and on; the figures go to `out` as JSON.
async fn long_table(args: &Args) -> Result<Value> {
    let pace = Duration::from_millis(args.maintenance_pace_ms);
    let off = maintenance::long_table(args.maintenance_commits, args.maintenance_keys, false, pace)
        .await?;
    let on = maintenance::long_table(args.maintenance_commits, args.maintenance_keys, true, pace)
        .await?;
    maintenance::print(&off, &on);
    Ok(json!({"off": off, "on": on}))
}

async fn bench(args: Args) -> Result<()> {
    maintenance::install_capture();
    if args.only_maintenance {
        let figures = long_table(&args).await?;
        std::fs::write(&args.out, serde_json::to_string_pretty(&figures)?)?;
        println!("wrote {}", Path::new(&args.out).display());
        return Ok(());
    }
    if let Some(list) = &args.sizes {
        let broker = Broker::start()?;
        let tuning = Tuning {
            commit_interval: args.commit_interval.clone(),
            transform_threads: args.transform_threads,
        };
        let figures = sizes::run(&broker, &sizes::parse(list)?, args.sizes_total, &tuning).await?;
        std::fs::write(&args.out, serde_json::to_string_pretty(&figures)?)?;
        println!("wrote {}", Path::new(&args.out).display());
        return Ok(());
    }
    let n = args.records;
    index_memory(n.max(1_000_000)).await?;
    let values: Vec<Vec<u8>> = (0..n).map(|i| record(i).to_string().into_bytes()).collect();
    let bytes: u64 = values.iter().map(|v| v.len() as u64).sum();
    println!(
        "workload: {n} JSON records, {:.0} bytes on average, {} partitions",
        bytes as f64 / n as f64,
        args.partitions
    );

    let broker = Broker::start()?;
    let topic = "bench";
    broker.create_topic(topic, args.partitions).await?;
    let started = Instant::now();
    for chunk in values.chunks(100_000) {
        let messages: Vec<Message> = chunk
            .iter()
            .enumerate()
            .map(|(i, v)| (Some(format!("k{i}").into_bytes()), Some(v.clone())))
            .collect();
        broker.produce(topic, &messages).await?;
    }
    println!(
        "produced in {:.1}s (not timed below)",
        started.elapsed().as_secs_f64()
    );

    let mut results = vec![read_only(&broker, topic, args.partitions, n, bytes)?];
    println!("{:?}", results.last().map(|f| (&f.scenario, f.rate())));
    if args.agents {
        for agents in 1..=3 {
            results.push(agents_run(&broker, topic, n, bytes, agents).await?);
            println!("{:?}", results.last().map(|f| (&f.scenario, f.rate())));
        }
        if args.only_agents {
            print_table(&results);
            return Ok(());
        }
    }
    results.push(encode_limit(&values, false).await?);
    println!("{:?}", results.last().map(|f| (&f.scenario, f.rate())));
    // Upsert: the same records with ids repeating ten times (n/10 keys), 16 MiB commits.
    let distinct = (args.records / 10).max(1);
    let upsert_values: Vec<Vec<u8>> = (0..args.records)
        .map(|i| {
            let mut v = record(i);
            v["id"] = json!(i % distinct);
            v.to_string().into_bytes()
        })
        .collect();
    results.push(encode_limit(&upsert_values, true).await?);
    println!("{:?}", results.last().map(|f| (&f.scenario, f.rate())));
    drop(upsert_values);
    drop(values);
    let rounds: Vec<usize> = (1..=args.rounds.max(1)).collect();
    let tuning = Tuning {
        commit_interval: args.commit_interval.clone(),
        transform_threads: args.transform_threads,
    };
    println!(
        "floe run: commit_interval {}, transform_threads {}",
        tuning.commit_interval,
        tuning.transform_threads.map_or_else(
            || format!("default ({})", floe::config::default_transform_threads()),
            |n| n.to_string()
        )
    );
    for &round in &rounds {
        for (i, run) in RUNS.iter().enumerate() {
            let mut figures = floe_run(
                &format!("r{round}p{i}"),
                &broker,
                topic,
                n,
                bytes,
                run,
                &tuning,
            )
            .await?;
            figures.round = Some(round);
            println!(
                "round {round}: {} {:.0} records/s",
                figures.scenario,
                figures.rate()
            );
            results.push(figures);
        }
    }
    if !args.skip_peer {
        results.push(python_peer(&broker, topic, n, bytes)?);
    }
    print_table(&results);

    let rate = |prefix: &str, round: Option<usize>| {
        results
            .iter()
            .find(|f| f.scenario.starts_with(prefix) && f.round == round)
            .map(Figures::rate)
    };
    // Each plugin scenario against the (c) run of its own round; the median of those.
    let by_round = |prefix: &str| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|&r| Some(rate(prefix, Some(r))? / rate("c:", Some(r))?))
            .collect()
    };
    let (d1, d3, chain) = (
        by_round("d: floe, 1 "),
        by_round("d: floe, 3 "),
        by_round("d: floe, filter"),
    );
    // (c) against the single-run scenarios: (c)'s median rate.
    let c = median(
        &rounds
            .iter()
            .filter_map(|&r| rate("c:", Some(r)))
            .collect::<Vec<_>>(),
    );
    let over = |b: Option<f64>| c.zip(b).map(|(c, b)| c / b);
    let ratios = json!({
        "c_over_a": over(rate("a:", None)),
        "c_over_b": over(rate("b:", None)),
        "d1_over_c": median(&d1),
        "d3_over_c": median(&d3),
        "chain_over_c": median(&chain),
        "c_over_e": over(rate("e:", None)),
    });
    let ratios_by_round = json!({
        "d1_over_c": d1,
        "d3_over_c": d3,
        "chain_over_c": chain,
    });
    println!(
        "\nratios (records/s; plugin ratios: median of {} rounds): {}\nby round: {}",
        rounds.len(),
        serde_json::to_string_pretty(&ratios)?,
        serde_json::to_string(&ratios_by_round)?
    );
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(floe_tests::repo_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let long = if args.skip_maintenance {
        Value::Null
    } else {
        long_table(&args).await?
    };
    let report = json!({
        "long_table": long,
        "commit": commit,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "records": n,
        "avg_record_bytes": bytes as f64 / n as f64,
        "partitions": args.partitions,
        "results": results,
        "ratios": ratios,
        "ratios_by_round": ratios_by_round,
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", Path::new(&args.out).display());
    Ok(())
}
