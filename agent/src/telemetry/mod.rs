//! Telemetry: logs (tracing), metrics (Prometheus text format) and health.
//!
//! - [`metric`]: every exported metric ([`METRICS`]) and one function per event; the
//!   functions are re-exported here (`telemetry::records_in`, ...).
//! - [`health`]: the registry behind `/readyz`, fed by the pipelines.
//! - [`server`]: the `[metrics] listen` endpoint: `/metrics`, `/healthz`, `/readyz`.
//! - [`scrape`]: the text format read back (for `floe top` and the progress line).
//!
//! Nothing is logged per record above `trace`. Metrics users alert on
//! `floe_seconds_since_last_commit{pipeline}` (age of the newest successful commit,
//! counted from pipeline start until the first one), `floe_consumer_lag` and
//! `floe_dead_letters_total`; `examples/grafana/` has a dashboard and alert rules. The
//! standard `process_*` metrics ([`process`]) come with every scrape.

pub mod health;
pub mod metric;
pub mod scrape;
pub mod server;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tracing_subscriber::fmt::MakeWriter;

pub use metric::*;

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`), e.g.
    /// `127.0.0.1:9464`, or `0.0.0.0:9464` in a container.
    pub listen: SocketAddr,
    /// `/readyz` fails when a table was not brought up to date for this many commit
    /// intervals (default 3).
    #[serde(default = "default_ready_commit_intervals")]
    pub ready_commit_intervals: NonZeroU32,
}

fn default_ready_commit_intervals() -> NonZeroU32 {
    NonZeroU32::new(3).expect("3 is not zero")
}

/// Errors of telemetry setup.
#[derive(Debug, thiserror::Error)]
#[error("cannot start metrics endpoint on {addr}: {reason}")]
pub struct TelemetryError {
    addr: SocketAddr,
    reason: String,
}

/// The exporter settings: histogram buckets of [`METRICS`].
pub(crate) fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(COMMIT_SECONDS.to_string()),
            COMMIT_SECONDS_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(PLUGIN_BATCH_SECONDS.to_string()),
                PLUGIN_BATCH_SECONDS_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(metric::MAINTENANCE_SECONDS.to_string()),
                metric::MAINTENANCE_SECONDS_BUCKETS,
            )
        })
        .expect("bucket lists are not empty")
}

/// Sends the help text of every metric to the current recorder.
pub(crate) fn describe() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
}

/// The process-wide metrics recorder, installed on first use (metrics are recorded
/// whether or not `[metrics]` serves them; the progress line of `floe run` reads them).
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = match builder().install_recorder() {
            Ok(h) => h,
            // Another recorder is installed (a host embedding the library): render ours,
            // which stays empty, rather than fail.
            Err(_) => builder().build_recorder().handle(),
        };
        describe();
        process().describe();
        metric::build_info();
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new()
            .name("floe-metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                }
            });
        handle
    })
}

/// The `process_*` metrics of Prometheus' client libraries (CPU seconds, resident and
/// virtual memory, open and maximum file descriptors, threads, start time), read from
/// the OS when `/metrics` is served.
pub fn process() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Starts the HTTP endpoint of `[metrics]` (call inside a Tokio runtime; it runs until
/// the runtime stops) and forgets the health of pipelines of an earlier run.
pub fn install(config: &MetricsConfig) -> Result<(), TelemetryError> {
    let handle = recorder().clone();
    health::reset();
    let state = server::State {
        handle,
        ready_commit_intervals: config.ready_commit_intervals.get(),
    };
    let addr = server::spawn(config.listen, state).map_err(|e| TelemetryError {
        addr: config.listen,
        reason: e.to_string(),
    })?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(())
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields at the top level, for log shippers.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?} (expected text or json)"
            )),
        }
    }
}

/// Logs to stderr as text, filtered by `RUST_LOG` (default `info`); ANSI colours only
/// when stderr is a terminal.
pub fn init_logging() {
    init_logging_to(
        LogFormat::Text,
        std::io::stderr().is_terminal(),
        std::io::stderr,
    );
}

/// Logs in `format` to `writer`, filtered by `RUST_LOG` (default `info`); `ansi` turns
/// colours on (text format only). A second call does nothing.
pub fn init_logging_to<W>(format: LogFormat, ansi: bool, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

/// One scheduled maintenance run of a table: `floe_maintenance_runs_total{result}`
/// and `floe_maintenance_seconds`.
pub fn maintenance(pipeline: &str, seconds: f64, failed: bool) {
    metric::maintenance(pipeline, seconds, failed);
}
