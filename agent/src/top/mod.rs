//! Operator views over the agent's metrics: `floe top` (a live terminal view of a running
//! agent's `/metrics`, or one text rendering with `--once`) and the progress lines of
//! `floe run` on a terminal. Both turn two scrapes into per-pipeline rates ([`Stats`]).

pub mod progress;
pub mod view;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use floe::telemetry::metric as m;
use floe::telemetry::scrape::Exposition;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

/// One scrape and when it was taken.
pub struct Scrape {
    /// The parsed text.
    pub exposition: Exposition,
    /// When it was read.
    pub at: Instant,
}

impl Scrape {
    /// Parses Prometheus text read now.
    pub fn parse(text: &str) -> std::io::Result<Scrape> {
        Ok(Scrape {
            exposition: Exposition::parse(text)?,
            at: Instant::now(),
        })
    }

    fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.exposition.sum(metric, labels)
    }

    /// Every value of `label` among Floe's series, sorted.
    fn label_values(&self, label: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .exposition
            .samples()
            .iter()
            .filter(|s| s.metric.starts_with("floe_"))
            .filter_map(|s| s.labels.get(label).map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// One pipeline's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PipelineStats {
    /// Pipeline name.
    pub name: String,
    /// Records read per second (`None` before a second scrape).
    pub in_per_sec: Option<f64>,
    /// Records committed per second.
    pub out_per_sec: Option<f64>,
    /// Sum of the consumer lag over its partitions.
    pub lag: Option<f64>,
    /// Partitions assigned.
    pub partitions: Option<f64>,
    /// Seconds since its last commit.
    pub since_commit: Option<f64>,
    /// Rows written and waiting for the next commit.
    pub waiting: Option<f64>,
    /// Seconds until the next commit.
    pub next_commit: Option<f64>,
    /// Whether it has committed since the agent started.
    pub committed_once: bool,
    /// Snapshots committed.
    pub commits: f64,
    /// Records committed.
    pub rows_out: f64,
    /// Data files committed.
    pub files: f64,
    /// Bytes of data files committed.
    pub bytes: f64,
    /// Records in the dead-letter file.
    pub dead_letters: f64,
    /// Commits refused by the fence.
    pub fences: f64,
    /// Commit retries plus transient-outage retries.
    pub retries: f64,
    /// Rebalance events.
    pub rebalances: f64,
}

/// One plugin's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginStats {
    /// Pipeline name.
    pub pipeline: String,
    /// Plugin name.
    pub plugin: String,
    /// Records in per second.
    pub in_per_sec: Option<f64>,
    /// Records out per second.
    pub out_per_sec: Option<f64>,
    /// Seconds spent in the plugin per second (1.0 = one core busy).
    pub busy: Option<f64>,
    /// Mean time per record, in microseconds, over the interval (or since start).
    pub us_per_record: Option<f64>,
    /// Records rejected (dead-lettered, dropped or failed).
    pub errors: f64,
    /// Faults (trap, panic, limit).
    pub faults: f64,
}

/// What the views show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Per pipeline, by name.
    pub pipelines: Vec<PipelineStats>,
    /// Per plugin, by pipeline then plugin.
    pub plugins: Vec<PluginStats>,
}

/// Per-second rate of a counter between two scrapes (a counter that went down was reset:
/// its new value counts).
fn rate(now: Option<f64>, before: Option<f64>, secs: f64) -> Option<f64> {
    let now = now?;
    let before = before.unwrap_or(0.0);
    let delta = if now >= before { now - before } else { now };
    (secs > 0.0).then(|| delta / secs)
}

impl Stats {
    /// Figures from the latest scrape, with rates against `before` when given.
    pub fn from_scrapes(now: &Scrape, before: Option<&Scrape>) -> Stats {
        let secs = before.map_or(0.0, |b| now.at.duration_since(b.at).as_secs_f64());
        let rate_of = |metric: &str, labels: &[(&str, &str)]| {
            let b = before?;
            rate(now.sum(metric, labels), b.sum(metric, labels), secs)
        };
        let mut pipelines = Vec::new();
        for name in now.label_values("pipeline") {
            let p = [("pipeline", name.as_str())];
            let get = |metric: &str| now.sum(metric, &p).unwrap_or(0.0);
            let commits = get(m::COMMITS);
            pipelines.push(PipelineStats {
                in_per_sec: rate_of(m::RECORDS_IN, &p),
                out_per_sec: rate_of(m::RECORDS_OUT, &p),
                lag: now.sum(m::CONSUMER_LAG, &p),
                partitions: now.sum(m::PARTITIONS_ASSIGNED, &p),
                since_commit: now.sum(m::SECONDS_SINCE_LAST_COMMIT, &p),
                waiting: now.sum(m::ROWS_UNCOMMITTED, &p),
                next_commit: now.sum(m::SECONDS_TO_NEXT_COMMIT, &p),
                committed_once: commits > 0.0,
                commits,
                rows_out: get(m::RECORDS_OUT),
                files: get(m::DATA_FILES),
                bytes: get(m::BYTES_COMMITTED),
                dead_letters: get(m::DEAD_LETTERS),
                fences: get(m::FENCES),
                retries: get(m::COMMIT_RETRIES) + get(m::TRANSIENT_RETRIES),
                rebalances: get(m::REBALANCES),
                name,
            });
        }
        let mut plugins = Vec::new();
        let sum_name = format!("{}_sum", m::PLUGIN_BATCH_SECONDS);
        for pipeline in now.label_values("pipeline") {
            for plugin in now.label_values("plugin") {
                let l = [("pipeline", pipeline.as_str()), ("plugin", plugin.as_str())];
                let Some(total_in) = now.sum(m::PLUGIN_RECORDS_IN, &l) else {
                    continue;
                };
                let spent = now.sum(&sum_name, &l);
                let us_per_record = match before {
                    Some(b) => {
                        let records = total_in - b.sum(m::PLUGIN_RECORDS_IN, &l).unwrap_or(0.0);
                        let secs = spent.unwrap_or(0.0) - b.sum(&sum_name, &l).unwrap_or(0.0);
                        (records > 0.0).then(|| secs / records * 1e6)
                    }
                    None => (total_in > 0.0).then(|| spent.unwrap_or(0.0) / total_in * 1e6),
                };
                plugins.push(PluginStats {
                    in_per_sec: rate_of(m::PLUGIN_RECORDS_IN, &l),
                    out_per_sec: rate_of(m::PLUGIN_RECORDS_OUT, &l),
                    busy: rate_of(&sum_name, &l),
                    us_per_record,
                    errors: now.sum(m::PLUGIN_RECORDS_FAILED, &l).unwrap_or(0.0),
                    faults: now.sum(m::PLUGIN_FAULTS, &l).unwrap_or(0.0),
                    pipeline: pipeline.clone(),
                    plugin,
                });
            }
        }
        Stats { pipelines, plugins }
    }
}

/// `1234567` as `1.2M`, `12345` as `12.3k`, `12` as `12`.
pub fn count(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a.fract() == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Bytes as `12.3 MiB`.
pub fn bytes(v: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

/// Seconds as `42s`, `3m05s`, `2h10m`.
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// `--metrics` as typed (`host:port`, `http://host:port`, or a full `.../metrics` URL)
/// -> (metrics URL, readiness URL).
pub fn endpoints(given: &str) -> (String, String) {
    let with_scheme = if given.contains("://") {
        given.to_string()
    } else {
        format!("http://{given}")
    };
    let (scheme, rest) = with_scheme.split_once("://").expect("has a scheme");
    let (host, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (rest, String::new()),
    };
    let metrics_path = if path.is_empty() || path == "/" {
        floe::telemetry::server::METRICS_PATH.to_string()
    } else {
        path.clone()
    };
    let base_path = metrics_path
        .strip_suffix(floe::telemetry::server::METRICS_PATH)
        .unwrap_or("");
    (
        format!("{scheme}://{host}{metrics_path}"),
        format!(
            "{scheme}://{host}{base_path}{}",
            floe::telemetry::server::READYZ_PATH
        ),
    )
}

/// Why `floe top` cannot show the agent's metrics.
#[derive(Debug, thiserror::Error)]
enum TopError {
    /// The HTTP client could not be built.
    #[error("{0}")]
    Client(#[source] reqwest::Error),
    /// The metrics endpoint did not answer, or its answer could not be read.
    #[error("cannot read {url}: {source}")]
    Unreachable {
        /// The metrics endpoint.
        url: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// The metrics endpoint answered with an error status.
    #[error("{url} answered {status}")]
    Status {
        /// The metrics endpoint.
        url: String,
        /// Its answer's status.
        status: reqwest::StatusCode,
    },
    /// The answer is not the Prometheus text format.
    #[error("{url} is not Prometheus text: {source}")]
    NotPrometheus {
        /// The metrics endpoint.
        url: String,
        /// Where it stops parsing.
        source: std::io::Error,
    },
    /// The terminal could not be switched to the full-screen view.
    #[error("cannot open the terminal: {0}")]
    OpenTerminal(#[source] std::io::Error),
    /// The screen could not be drawn.
    #[error("cannot draw: {0}")]
    Draw(#[source] std::io::Error),
    /// Key presses could not be read.
    #[error("cannot read the terminal: {0}")]
    ReadTerminal(#[source] std::io::Error),
}

/// Reads the agent's endpoints.
struct Client {
    http: reqwest::Client,
    metrics: String,
    readyz: String,
}

impl Client {
    fn new(given: &str) -> Result<Client, TopError> {
        let (metrics, readyz) = endpoints(given);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(TopError::Client)?;
        Ok(Client {
            http,
            metrics,
            readyz,
        })
    }

    async fn scrape(&self) -> Result<Scrape, TopError> {
        let unreachable = |source| TopError::Unreachable {
            url: self.metrics.clone(),
            source,
        };
        let response = self
            .http
            .get(&self.metrics)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        let text = response.text().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(TopError::Status {
                url: self.metrics.clone(),
                status,
            });
        }
        Scrape::parse(&text).map_err(|source| TopError::NotPrometheus {
            url: self.metrics.clone(),
            source,
        })
    }

    /// The `/readyz` body, if the endpoint answers with a verdict.
    async fn readiness(&self) -> Option<String> {
        let text = self
            .http
            .get(&self.readyz)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        (text.starts_with("ready\n") || text.starts_with("not ready\n")).then_some(text)
    }
}

/// `floe top`.
pub fn run_command(metrics: &str, interval: Duration, once: bool, width: Option<u16>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let client = match Client::new(metrics) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("floe top: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if once {
        runtime
            .block_on(once_text(&client, interval, width))
            .map(|text| print!("{text}"))
    } else {
        live(&runtime, &client, interval)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floe top: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn once_text(
    client: &Client,
    interval: Duration,
    width: Option<u16>,
) -> Result<String, TopError> {
    let before = client.scrape().await?;
    tokio::time::sleep(interval).await;
    let now = client.scrape().await?;
    let readiness = client.readiness().await;
    let stats = Stats::from_scrapes(&now, Some(&before));
    let screen = view::Screen {
        source: &client.metrics,
        stats: &stats,
        readiness: readiness.as_deref(),
        refresh: interval,
        error: None,
        live: false,
    };
    let width = width.unwrap_or_else(|| {
        if std::io::stdout().is_terminal() {
            ratatui::crossterm::terminal::size().map_or(132, |(w, _)| w)
        } else {
            132
        }
    });
    Ok(view::render_text(
        &screen,
        width.min(view::natural_width(&screen)),
    ))
}

fn live(
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    interval: Duration,
) -> Result<(), TopError> {
    // Fail before taking over the terminal if the endpoint does not answer at all.
    let mut before = runtime.block_on(client.scrape())?;
    let mut stats = Stats::from_scrapes(&before, None);
    let mut readiness = runtime.block_on(client.readiness());
    let mut error: Option<String> = None;
    let mut terminal = ratatui::try_init().map_err(TopError::OpenTerminal)?;
    let mut next = Instant::now() + interval;
    let outcome = loop {
        let screen = view::Screen {
            source: &client.metrics,
            stats: &stats,
            readiness: readiness.as_deref(),
            refresh: interval,
            error: error.as_deref(),
            live: true,
        };
        if let Err(e) = terminal.draw(|f| view::draw(f, &screen)) {
            break Err(TopError::Draw(e));
        }
        let wait = next.saturating_duration_since(Instant::now());
        match event::poll(wait) {
            Ok(true) => {
                if let Ok(Event::Key(key)) = event::read() {
                    let ctrl_c = key.code == KeyCode::Char('c')
                        && key.modifiers.contains(KeyModifiers::CONTROL);
                    if key.kind == KeyEventKind::Press
                        && (ctrl_c || matches!(key.code, KeyCode::Char('q') | KeyCode::Esc))
                    {
                        break Ok(());
                    }
                }
                continue;
            }
            Ok(false) => {}
            Err(e) => break Err(TopError::ReadTerminal(e)),
        }
        next = Instant::now() + interval;
        match runtime.block_on(client.scrape()) {
            Ok(now) => {
                stats = Stats::from_scrapes(&now, Some(&before));
                before = now;
                error = None;
            }
            Err(e) => error = Some(e.to_string()),
        }
        readiness = runtime.block_on(client.readiness());
    };
    ratatui::restore();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(text: &str, at: Instant) -> Scrape {
        Scrape {
            exposition: Exposition::parse(text).expect("parses"),
            at,
        }
    }

    const BEFORE: &str = "# TYPE floe_records_in_total counter\n\
floe_records_in_total{pipeline=\"events\"} 100\n\
# TYPE floe_records_out_total counter\n\
floe_records_out_total{pipeline=\"events\"} 0\n\
# TYPE floe_plugin_records_in_total counter\n\
floe_plugin_records_in_total{pipeline=\"events\",plugin=\"filter\"} 100\n\
# TYPE floe_plugin_batch_seconds histogram\n\
floe_plugin_batch_seconds_sum{pipeline=\"events\",plugin=\"filter\"} 0.01\n\
floe_plugin_batch_seconds_count{pipeline=\"events\",plugin=\"filter\"} 1\n";

    const NOW: &str = "# TYPE floe_records_in_total counter\n\
floe_records_in_total{pipeline=\"events\"} 300\n\
# TYPE floe_records_out_total counter\n\
floe_records_out_total{pipeline=\"events\"} 250\n\
# TYPE floe_commits_total counter\n\
floe_commits_total{pipeline=\"events\"} 2\n\
# TYPE floe_consumer_lag gauge\n\
floe_consumer_lag{pipeline=\"events\",topic=\"t\",partition=\"0\"} 5\n\
floe_consumer_lag{pipeline=\"events\",topic=\"t\",partition=\"1\"} 7\n\
# TYPE floe_seconds_since_last_commit gauge\n\
floe_seconds_since_last_commit{pipeline=\"events\"} 1.5\n\
# TYPE floe_dead_letters_total counter\n\
floe_dead_letters_total{pipeline=\"events\",stage=\"decode\"} 2\n\
floe_dead_letters_total{pipeline=\"events\",stage=\"schema\"} 1\n\
# TYPE floe_commit_retries_total counter\n\
floe_commit_retries_total{pipeline=\"events\"} 1\n\
# TYPE floe_transient_retries_total counter\n\
floe_transient_retries_total{pipeline=\"events\",stage=\"catalog\"} 2\n\
# TYPE floe_plugin_records_in_total counter\n\
floe_plugin_records_in_total{pipeline=\"events\",plugin=\"filter\"} 300\n\
# TYPE floe_plugin_records_failed_total counter\n\
floe_plugin_records_failed_total{pipeline=\"events\",plugin=\"filter\",policy=\"drop\"} 4\n\
# TYPE floe_plugin_batch_seconds histogram\n\
floe_plugin_batch_seconds_sum{pipeline=\"events\",plugin=\"filter\"} 0.03\n\
floe_plugin_batch_seconds_count{pipeline=\"events\",plugin=\"filter\"} 2\n";

    #[test]
    fn rates_and_totals_from_two_scrapes() {
        let t0 = Instant::now();
        let before = scrape(BEFORE, t0);
        let now = scrape(NOW, t0 + Duration::from_secs(2));
        let stats = Stats::from_scrapes(&now, Some(&before));
        let p = &stats.pipelines[0];
        assert_eq!(p.name, "events");
        assert_eq!(p.in_per_sec, Some(100.0));
        assert_eq!(p.out_per_sec, Some(125.0));
        assert_eq!(p.lag, Some(12.0));
        assert_eq!(p.since_commit, Some(1.5));
        assert_eq!(p.dead_letters, 3.0);
        assert_eq!(p.retries, 3.0);
        assert!(p.committed_once);
        let f = &stats.plugins[0];
        assert_eq!(
            (f.pipeline.as_str(), f.plugin.as_str()),
            ("events", "filter")
        );
        assert_eq!(f.in_per_sec, Some(100.0));
        assert!((f.busy.expect("busy") - 0.01).abs() < 1e-9);
        assert!((f.us_per_record.expect("us") - 100.0).abs() < 1e-6);
        assert_eq!(f.errors, 4.0);
        // One scrape: totals but no rates.
        let single = Stats::from_scrapes(&now, None);
        assert_eq!(single.pipelines[0].in_per_sec, None);
        assert_eq!(single.pipelines[0].commits, 2.0);
    }

    #[test]
    fn counter_reset_counts_the_new_value() {
        assert_eq!(rate(Some(10.0), Some(500.0), 2.0), Some(5.0));
        assert_eq!(rate(None, Some(1.0), 2.0), None);
    }

    #[test]
    fn formats() {
        assert_eq!(count(12.0), "12");
        assert_eq!(count(2.5), "2.5");
        assert_eq!(count(12_345.0), "12.3k");
        assert_eq!(count(1_234_567.0), "1.2M");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(3.5 * 1024.0 * 1024.0), "3.5 MiB");
        assert_eq!(age(4.4), "4s");
        assert_eq!(age(185.0), "3m05s");
        assert_eq!(age(7800.0), "2h10m");
    }

    #[test]
    fn endpoint_forms() {
        let want = (
            "http://127.0.0.1:9464/metrics".to_string(),
            "http://127.0.0.1:9464/readyz".to_string(),
        );
        assert_eq!(endpoints("127.0.0.1:9464"), want);
        assert_eq!(endpoints("http://127.0.0.1:9464"), want);
        assert_eq!(endpoints("http://127.0.0.1:9464/"), want);
        assert_eq!(endpoints("http://127.0.0.1:9464/metrics"), want);
        assert_eq!(
            endpoints("https://proxy/floe/metrics"),
            (
                "https://proxy/floe/metrics".to_string(),
                "https://proxy/floe/readyz".to_string()
            )
        );
    }
}
