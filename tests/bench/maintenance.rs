//! (f) A table that lives long: 1,000 upsert commits over 10,000 keys, with table
//! maintenance off and on. Figures: live data and delete files, snapshots, bytes under
//! the table's `metadata/` folder, commit latency of the first and last 100 commits (the
//! agent's own `committed` log line: Parquet write plus Iceberg commit), and DuckDB's
//! full-scan time after the first 100 and after the last commit.
//!
//! The pipeline runs in-process on a scripted source (no Kafka: the figures are about
//! the table), 100 records per commit, one commit per commit interval (1 s, the
//! shortest; `--maintenance-pace-ms` can only slow it down). With maintenance on, a task runs
//! every maintenance job on the table every 50 commits while the commits go on, as
//! `floe run` does with `[pipelines.sink.maintenance]` (there every `interval`).

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use floe_iceberg::manifests;
use floe_tests::Workspace;
use iceberg::TableIdent;
use iceberg::spec::DataContentType;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};

/// Latencies (ms) of the pipeline's commits, from its `committed` log lines.
static COMMITS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// A tracing layer that records the `ms` field of the committer's `committed` events.
struct CommitLatency;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CommitLatency {
    fn on_event(&self, event: &tracing::Event<'_>, _: LayerContext<'_, S>) {
        if !event.metadata().target().starts_with("floe::pipeline") {
            return;
        }
        #[derive(Default)]
        struct Fields {
            committed: bool,
            ms: Option<u64>,
        }
        impl Visit for Fields {
            fn record_u64(&mut self, field: &Field, value: u64) {
                if field.name() == "ms" {
                    self.ms = Some(value);
                }
            }
            fn record_str(&mut self, field: &Field, value: &str) {
                if field.name() == "message" && value == "committed" {
                    self.committed = true;
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}") == "committed" {
                    self.committed = true;
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let (true, Some(ms)) = (fields.committed, fields.ms) {
            COMMITS.lock().expect("commits").push(ms);
        }
    }
}

/// Installs the commit-latency layer (once per process).
pub fn install_capture() {
    let subscriber = tracing_subscriber::registry().with(CommitLatency);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The figures of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LongTable {
    pub maintenance: bool,
    pub commits: usize,
    pub keys: u64,
    pub data_files: usize,
    pub delete_files: usize,
    pub snapshots: usize,
    pub metadata_bytes: u64,
    pub commit_ms_first_100: f64,
    pub commit_ms_last_100: f64,
    pub commit_p50_ms_first_100: f64,
    pub commit_p50_ms_last_100: f64,
    pub scan_s_after_100: f64,
    pub scan_s_after_last: f64,
    pub maintenance_runs: usize,
    pub seconds: f64,
}

impl LongTable {
    pub fn commit_ratio(&self) -> f64 {
        self.commit_ms_last_100 / self.commit_ms_first_100
    }
    pub fn scan_ratio(&self) -> f64 {
        self.scan_s_after_last / self.scan_s_after_100
    }
}

/// Runs the scenario once.
/// Commits are paced: one starts at most every `pace`, and at most one per commit
/// interval (1 s).
pub async fn long_table(
    commits: usize,
    keys: u64,
    maintenance: bool,
    pace: Duration,
) -> Result<LongTable> {
    const PER_COMMIT: usize = 100;
    let ws = Workspace::new()?;
    let d = ws.dir.path().display();
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
table = "long"
create_table = true
commit_interval = "1s"
mode = "upsert"
key = ["id"]
[pipelines.sink.maintenance]
interval = "5s"
keep_snapshots = 10
max_snapshot_age = "0s"
keep_metadata_files = 10
"#
    );
    let path = ws.path("floe.toml");
    std::fs::write(&path, &config)?;
    let parsed = floe::config::Config::load(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let handle = floe_iceberg::open_catalog("local", &parsed.catalogs["local"]).await?;
    let target = floe::maintain::targets(&parsed.pipelines[0])
        .into_iter()
        .next()
        .context("target")?;
    COMMITS.lock().expect("commits").clear();
    let pipeline = floe_tests::scripted::ScriptedPipeline::start(&path).await?;
    pipeline.assign("bench", &[(0, None, vec![None])]);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Held by a maintenance run, and by a scan measurement (scans are timed alone).
    let quiet = Arc::new(tokio::sync::Mutex::new(()));
    // Maintenance runs every EVERY commits, next to the commits that go on: about what
    // a 10-minute interval is to a pipeline committing every 10 to 15 seconds.
    const EVERY: usize = 50;
    let (trigger, mut trigger_rx) = tokio::sync::mpsc::channel::<()>(1);
    let maintainer = maintenance.then(|| {
        let (handle, target, stop, runs, quiet) = (
            handle.clone(),
            target.clone(),
            stop.clone(),
            runs.clone(),
            quiet.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // Woken every EVERY commits (or at the end).
                if trigger_rx.recv().await.is_none() {
                    return;
                }
                let _alone = quiet.lock().await;
                let t = Instant::now();
                let report = floe::maintain::run_table(&handle, &target, false).await;
                if std::env::var_os("FLOE_BENCH_VERBOSE").is_some() {
                    eprintln!(
                        "maintenance run in {:.2}s:\n{}",
                        t.elapsed().as_secs_f64(),
                        floe::maintain::render(std::slice::from_ref(&report), false)
                    );
                }
                if let Some(j) = report.jobs.iter().find(|j| j.failed) {
                    eprintln!("maintenance job {} failed: {}", j.job, j.detail);
                }
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    });

    let topic: Arc<str> = Arc::from("bench");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    // First the keys are loaded (keys / 100 commits of new keys, not timed), then the
    // timed commits update (and add) random keys: every timed commit does the same work.
    let warm = (keys as usize).div_ceil(PER_COMMIT);
    let total = warm + commits;
    let started = Instant::now();
    let mut scan_after_100 = 0.0;
    let mut offset = 0i64;
    for c in 0..total {
        let due = started + pace * c as u32;
        tokio::time::sleep_until(due.into()).await;
        let batch: Vec<floe::record::Message> = (0..PER_COMMIT)
            .map(|i| {
                let id = if c < warm {
                    ((c * PER_COMMIT + i) as u64) % keys
                } else {
                    next() % keys
                };
                let v = json!({"id": id, "v": next() % 1_000_000, "note": format!("commit {c}")});
                offset += 1;
                floe::record::Message {
                    topic: topic.clone(),
                    partition: 0,
                    offset: offset - 1,
                    timestamp_ms: Some(0),
                    key: None,
                    value: Some(v.to_string().into_bytes()),
                    headers: Vec::new(),
                }
            })
            .collect();
        pipeline.push(batch);
        let deadline = Instant::now() + Duration::from_secs(120);
        while COMMITS.lock().expect("commits").len() < c + 1 {
            if Instant::now() > deadline || pipeline.is_finished() {
                bail!("commit {c} did not land");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Scans are timed when the last maintenance run is EVERY commits old, at both
        // points, before the run due then.
        if c + 1 == warm + 100.min(commits) {
            let _alone = quiet.lock().await;
            scan_after_100 = scan_seconds(&ws)?;
        }
        if (c + 1) % EVERY == 0 && c + 1 < total {
            let _ = trigger.try_send(());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(trigger);
    if let Some(m) = maintainer {
        m.await?;
    }
    pipeline.stop().await??;
    let scan_after_last = {
        let _alone = quiet.lock().await;
        scan_seconds(&ws)?
    };

    let all = COMMITS.lock().expect("commits").clone();
    let timed = &all[warm.min(all.len())..all.len().min(total)];
    let mean = |s: &[u64]| s.iter().sum::<u64>() as f64 / s.len().max(1) as f64;
    let median = |s: &[u64]| {
        let mut v = s.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or_default() as f64
    };
    let n = timed.len();
    let (head, tail) = (&timed[..100.min(n)], &timed[n.saturating_sub(100)..]);
    let (first, last) = (mean(head), mean(tail));
    let (first_p50, last_p50) = (median(head), median(tail));

    let table = handle
        .catalog
        .load_table(&TableIdent::from_strs(["bench", "long"])?)
        .await?;
    let live = manifests::live_files(
        &table,
        table.metadata().current_snapshot().context("snapshot")?,
    )
    .await?;
    let data_files = live
        .iter()
        .filter(|f| f.content() == DataContentType::Data)
        .count();
    let metadata_dir = floe_iceberg::orphans::local_dir(table.metadata().location())
        .context("local table")?
        .join("metadata");
    Ok(LongTable {
        maintenance,
        commits,
        keys,
        data_files,
        delete_files: live.len() - data_files,
        snapshots: table.metadata().snapshots().count(),
        metadata_bytes: dir_bytes(&metadata_dir)?,
        commit_ms_first_100: first,
        commit_ms_last_100: last,
        commit_p50_ms_first_100: first_p50,
        commit_p50_ms_last_100: last_p50,
        scan_s_after_100: scan_after_100,
        scan_s_after_last: scan_after_last,
        maintenance_runs: runs.load(std::sync::atomic::Ordering::SeqCst),
        seconds,
    })
}

fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if m.is_file() {
            total += m.len();
        }
    }
    Ok(total)
}

/// DuckDB's time for a full scan of the table (every column, deletes applied), best of 3.
fn scan_seconds(ws: &Workspace) -> Result<f64> {
    let python = std::env::var_os("FLOE_PYTHON")
        .context("FLOE_PYTHON is not set: run scripts/bench.sh (it sources scripts/env.sh)")?;
    let out = Command::new(python)
        .arg(floe_tests::repo_root().join("tests/bench/scan_time.py"))
        .arg("--catalog-db")
        .arg(ws.path("catalog.db"))
        .args(["--table", "bench.long"])
        .output()?;
    if !out.status.success() {
        bail!("scan_time.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// Prints the off/on table and the ratios.
pub fn print(off: &LongTable, on: &LongTable) {
    println!(
        "\n(f) {} upsert commits of 100 records over {} keys (after loading them), maintenance off vs on",
        off.commits, off.keys
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "", "maintenance off", "maintenance on"
    );
    let row = |name: &str, a: String, b: String| println!("{name:<34} {a:>14} {b:>14}");
    row(
        "live data files",
        off.data_files.to_string(),
        on.data_files.to_string(),
    );
    row(
        "live delete files",
        off.delete_files.to_string(),
        on.delete_files.to_string(),
    );
    row(
        "snapshots",
        off.snapshots.to_string(),
        on.snapshots.to_string(),
    );
    row(
        "metadata bytes",
        off.metadata_bytes.to_string(),
        on.metadata_bytes.to_string(),
    );
    row(
        "commit ms, first 100 (mean)",
        format!("{:.1}", off.commit_ms_first_100),
        format!("{:.1}", on.commit_ms_first_100),
    );
    row(
        "commit ms, last 100 (mean)",
        format!("{:.1}", off.commit_ms_last_100),
        format!("{:.1}", on.commit_ms_last_100),
    );
    row(
        "commit ms, first 100 (median)",
        format!("{:.1}", off.commit_p50_ms_first_100),
        format!("{:.1}", on.commit_p50_ms_first_100),
    );
    row(
        "commit ms, last 100 (median)",
        format!("{:.1}", off.commit_p50_ms_last_100),
        format!("{:.1}", on.commit_p50_ms_last_100),
    );
    row(
        "commit latency last/first (mean)",
        format!("{:.2}x", off.commit_ratio()),
        format!("{:.2}x", on.commit_ratio()),
    );
    row(
        "DuckDB full scan s, after 100",
        format!("{:.3}", off.scan_s_after_100),
        format!("{:.3}", on.scan_s_after_100),
    );
    row(
        "DuckDB full scan s, after last",
        format!("{:.3}", off.scan_s_after_last),
        format!("{:.3}", on.scan_s_after_last),
    );
    row(
        "scan time last/first",
        format!("{:.2}x", off.scan_ratio()),
        format!("{:.2}x", on.scan_ratio()),
    );
    row(
        "maintenance runs",
        off.maintenance_runs.to_string(),
        on.maintenance_runs.to_string(),
    );
    row(
        "wall seconds",
        format!("{:.0}", off.seconds),
        format!("{:.0}", on.seconds),
    );
}
