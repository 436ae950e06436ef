//! `floe-soak`: the agent's memory and file descriptors over hours of steady traffic.
//!
//! Produces JSON records of about 134 bytes at a fixed rate (`--rate`, records per
//! second) into librdkafka's mock cluster, a Kafka-protocol broker in this process that
//! keeps only the newest 5 MiB of each partition (Tansu, the broker the tests use,
//! keeps every record in memory, which hours of traffic do not fit in). The `floe`
//! binary reads them with one passthrough plugin into an embedded-catalog table with
//! scheduled maintenance (compaction, snapshot expiry, orphan and metadata cleanup),
//! and every `--sample` seconds the agent's RSS, open file descriptors, CPU, records
//! in and out and consumer lag are recorded. At the end the RSS slope (least squares,
//! MiB per hour) is computed over the samples after the warm-up (the first sixth of the
//! run, at least 5 minutes), and the figures go to `--out` as JSON.
//!
//! `scripts/soak.sh` builds and runs it (10 minutes by default; `--minutes 120` for the
//! full soak).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use floe_tests::{free_port, scrape_metrics};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Minutes of traffic.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Records per second produced.
    #[arg(long, default_value_t = 150_000)]
    rate: u64,
    /// Topic partitions (more partitions: more seconds of data the mock broker keeps).
    #[arg(long, default_value_t = 128)]
    partitions: i32,
    /// Seconds between samples.
    #[arg(long, default_value_t = 60)]
    sample: u64,
    /// `commit_interval` of the pipeline.
    #[arg(long, default_value = "60s")]
    commit_interval: String,
    /// Run without the passthrough plugin.
    #[arg(long)]
    no_plugin: bool,
    /// Where the JSON results go.
    #[arg(long, default_value = "soak-results.json")]
    out: PathBuf,
    /// Where the table and logs go (default: a temporary directory, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    minute: f64,
    rss_mib: f64,
    fds: usize,
    cpu_s: f64,
    records_in: f64,
    records_out: f64,
    lag: f64,
    produced: u64,
}

fn record(i: u64) -> Vec<u8> {
    const EVENTS: [&str; 5] = ["page_view", "click", "signup", "purchase", "logout"];
    json!({
        "id": i,
        "user": format!("user-{}@example.com", (i * 7919) % 100_000),
        "event": EVENTS[(i % 5) as usize],
        "amount": (i % 10_000) as f64 / 100.0,
        "ts": format!("2024-01-01T{:02}:{:02}:{:02}.{:06}Z", (i / 3600) % 24, (i / 60) % 60, i % 60, i % 1_000_000),
        "tags": ["beta", "web"],
    })
    .to_string()
    .into_bytes()
}

fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().ok()? + fields[12].parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The sum of a metric over its label sets.
fn sum_of(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// Produces `rate` records a second until `stop`, counting them in `produced`.
fn produce(
    bootstrap: String,
    rate: u64,
    stop: Arc<AtomicBool>,
    produced: Arc<AtomicU64>,
) -> Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let started = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        if i >= due {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        while i < due {
            let value = record(i);
            let key = (i % 997).to_string();
            let mut rec = BaseRecord::to("soak").payload(&value).key(&key);
            loop {
                match producer.send(rec) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        rec = r;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            i += 1;
            if i.is_multiple_of(1024) {
                produced.store(i, Ordering::Relaxed);
            }
        }
        produced.store(i, Ordering::Relaxed);
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

fn write_config(dir: &std::path::Path, bootstrap: &str, port: u16, args: &Args) -> Result<PathBuf> {
    let d = dir.display();
    let plugin = if args.no_plugin {
        String::new()
    } else {
        let plugins = std::env::var("FLOE_PLUGIN_DIR")
            .context("FLOE_PLUGIN_DIR (scripts/soak.sh sets it)")?;
        format!("\n[[pipelines.transforms]]\nuses = \"{plugins}/passthrough.wasm\"\n")
    };
    let text = format!(
        r#"[metrics]
listen = "127.0.0.1:{port}"

[plugins]
cache_dir = "{d}/wasm-cache"

[catalogs.local]
type = "embedded"
path = "{d}/catalog.db"
warehouse = "{d}/warehouse"

[[pipelines]]
name = "soak"

[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "floe-soak"
topics = ["soak"]
start = "earliest"
{plugin}
[pipelines.sink]
catalog = "local"
namespace = "soak"
table = "events"
create_table = true
commit_interval = "{interval}"

[pipelines.sink.maintenance]
interval = "5m"
min_input_files = 5
keep_snapshots = 10
max_snapshot_age = "30m"
orphan_age = "2h"
keep_metadata_files = 10

[pipelines.dead_letter]
path = "{d}/dead-letter.ndjson"
"#,
        interval = args.commit_interval,
    );
    let path = dir.join("floe.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let floe = std::env::var("FLOE_BIN").context("FLOE_BIN (scripts/soak.sh sets it)")?;
    let temp = tempfile::Builder::new().prefix("floe-soak-").tempdir()?;
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;

    let cluster = MockCluster::new(1)?;
    cluster.create_topic("soak", args.partitions, 1)?;
    let bootstrap = cluster.bootstrap_servers();
    let port = free_port();
    let config = write_config(&dir, &bootstrap, port, &args)?;

    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let producer = {
        let (bootstrap, stop, produced) = (bootstrap.clone(), stop.clone(), produced.clone());
        let rate = args.rate;
        std::thread::spawn(move || produce(bootstrap, rate, stop, produced))
    };
    let log = std::fs::File::create(dir.join("agent.log"))?;
    let mut agent: Child = Command::new(&floe)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--no-progress", "--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start floe")?;
    let pid = agent.id();

    let started = Instant::now();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut samples: Vec<Sample> = Vec::new();
    println!("| minute | RSS MiB | fds | CPU s | produced | records in | records out | lag |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut next = Duration::ZERO;
    while started.elapsed() < total {
        if let Some(status) = agent.try_wait()? {
            stop.store(true, Ordering::Relaxed);
            bail!(
                "floe exited ({status}) during the soak; see {}",
                dir.join("agent.log").display()
            );
        }
        if started.elapsed() >= next {
            let metrics = scrape_metrics(&format!("127.0.0.1:{port}")).unwrap_or_default();
            let s = Sample {
                minute: started.elapsed().as_secs_f64() / 60.0,
                rss_mib: status_mib(pid, "VmRSS:").unwrap_or_default(),
                fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count()),
                cpu_s: cpu_seconds(pid).unwrap_or_default(),
                records_in: sum_of(&metrics, "floe_records_in_total"),
                records_out: sum_of(&metrics, "floe_records_out_total"),
                lag: sum_of(&metrics, "floe_consumer_lag"),
                produced: produced.load(Ordering::Relaxed),
            };
            println!(
                "| {:.1} | {:.0} | {} | {:.0} | {} | {:.0} | {:.0} | {:.0} |",
                s.minute, s.rss_mib, s.fds, s.cpu_s, s.produced, s.records_in, s.records_out, s.lag
            );
            let _ = std::io::stdout().flush();
            samples.push(s);
            next += Duration::from_secs(args.sample);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    let peak = status_mib(pid, "VmHWM:").unwrap_or_default();
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    let status = agent.wait()?;

    let warm = (args.minutes / 6.0).max(5.0).min(args.minutes / 2.0);
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.minute >= warm).collect();
    let rss: Vec<(f64, f64)> = steady
        .iter()
        .map(|s| (s.minute / 60.0, s.rss_mib))
        .collect();
    let fds: Vec<(f64, f64)> = steady
        .iter()
        .map(|s| (s.minute / 60.0, s.fds as f64))
        .collect();
    let rss_slope = slope(&rss);
    let (min, max) = steady.iter().fold((f64::MAX, 0f64), |(lo, hi), s| {
        (lo.min(s.rss_mib), hi.max(s.rss_mib))
    });
    let last = samples.last().context("no sample")?;
    let rate_in = last.records_in / (last.minute * 60.0);
    println!();
    println!(
        "soak: {:.0} min at {} records/s produced ({:.0} read per s), exit {status}; RSS after warm-up ({warm:.0} min) {min:.0}-{max:.0} MiB, slope {rss_slope:+.1} MiB/h; peak {peak:.0} MiB; fds slope {:+.1}/h",
        args.minutes,
        args.rate,
        rate_in,
        slope(&fds),
    );
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let errors = log
        .lines()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .count();
    let gaps = log
        .lines()
        .filter(|l| l.contains("offset gap") || l.contains("retention"))
        .count();
    let commits = log
        .lines()
        .filter(|l| l.contains("\"message\":\"committed\""))
        .count();
    let maintenance = log
        .lines()
        .filter(|l| l.contains("maintenance") && l.contains("INFO"))
        .count();
    println!(
        "soak: {commits} commits, {maintenance} maintenance log lines, {errors} errors, {gaps} gap lines"
    );
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({
            "minutes": args.minutes, "rate": args.rate, "partitions": args.partitions,
            "plugin": !args.no_plugin, "commit_interval": args.commit_interval,
            "warm_up_minutes": warm, "rss_slope_mib_per_hour": rss_slope,
            "rss_min_mib": min, "rss_max_mib": max, "peak_rss_mib": peak,
            "fd_slope_per_hour": slope(&fds), "read_per_s": rate_in,
            "commits": commits, "errors": errors, "gap_lines": gaps,
            "exit_ok": status.success(), "samples": samples,
        }))?,
    )?;
    println!("wrote {}", args.out.display());
    if !status.success() || errors > 0 {
        bail!(
            "the agent logged {errors} errors or exited with {status}; see {}",
            dir.join("agent.log").display()
        );
    }
    drop(cluster);
    Ok(())
}
