//! Telemetry: logs (tracing) and metrics (Prometheus text format).
//!
//! Nothing is logged per record above `trace`. Metrics users alert on:
//! - `floe_seconds_since_last_commit{pipeline}`: age of the newest successful commit
//!   (counted from pipeline start until the first one);
//! - `floe_consumer_lag{pipeline,topic,partition}`: high watermark minus next offset read;
//! - `floe_records_in_total`, `floe_records_out_total`, `floe_records_failed_total{stage}`.

use std::net::SocketAddr;

use serde::Deserialize;

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the Prometheus scrape endpoint, e.g. `127.0.0.1:9464`.
    pub listen: SocketAddr,
}

/// Errors of telemetry setup.
#[derive(Debug, thiserror::Error)]
#[error("cannot start metrics endpoint on {addr}: {reason}")]
pub struct TelemetryError {
    addr: SocketAddr,
    reason: String,
}

/// Starts the Prometheus endpoint.
pub fn install(config: &MetricsConfig) -> Result<(), TelemetryError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(config.listen)
        .install()
        .map_err(|e| TelemetryError {
            addr: config.listen,
            reason: e.to_string(),
        })
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Records read from Kafka.
pub fn records_in(pipeline: &str, n: u64) {
    metrics::counter!("floe_records_in_total", "pipeline" => pipeline.to_string()).increment(n);
}

/// Records committed to the table.
pub fn records_out(pipeline: &str, n: u64) {
    metrics::counter!("floe_records_out_total", "pipeline" => pipeline.to_string()).increment(n);
}

/// Records sent to the dead-letter path, by the stage that rejected them.
pub fn records_failed(pipeline: &str, stage: &'static str) {
    metrics::counter!("floe_records_failed_total", "pipeline" => pipeline.to_string(), "stage" => stage).increment(1);
}

/// Age of the newest successful commit.
pub fn seconds_since_last_commit(pipeline: &str, seconds: f64) {
    metrics::gauge!("floe_seconds_since_last_commit", "pipeline" => pipeline.to_string())
        .set(seconds);
}

/// A commit finished: snapshot count and files.
pub fn committed(pipeline: &str, files: usize) {
    metrics::counter!("floe_commits_total", "pipeline" => pipeline.to_string()).increment(1);
    metrics::counter!("floe_data_files_total", "pipeline" => pipeline.to_string())
        .increment(files as u64);
}

/// Consumer lag of one partition.
pub fn consumer_lag(pipeline: &str, topic: &str, partition: i32, lag: i64) {
    metrics::gauge!("floe_consumer_lag", "pipeline" => pipeline.to_string(), "topic" => topic.to_string(), "partition" => partition.to_string())
        .set(lag as f64);
}

/// One batch through one plugin: records in and out, and time spent.
/// `floe_plugin_seconds_total` is a counter of whole seconds: the caller carries the
/// fractions over to the next batch and passes the `whole_seconds` they add up to.
pub fn plugin_batch(
    pipeline: &str,
    plugin: &str,
    records_in: usize,
    records_out: usize,
    spent: std::time::Duration,
    whole_seconds: u64,
) {
    let labels = [
        ("pipeline", pipeline.to_string()),
        ("plugin", plugin.to_string()),
    ];
    metrics::counter!("floe_plugin_records_in_total", &labels).increment(records_in as u64);
    metrics::counter!("floe_plugin_records_out_total", &labels).increment(records_out as u64);
    metrics::counter!("floe_plugin_seconds_total", &labels).increment(whole_seconds);
    metrics::histogram!("floe_plugin_batch_seconds", &labels).record(spent.as_secs_f64());
}

/// A record a plugin rejected, by what happened to it (`dead_letter`, `drop`, `fail`).
pub fn plugin_record_error(pipeline: &str, plugin: &str, policy: &'static str) {
    metrics::counter!("floe_plugin_records_failed_total", "pipeline" => pipeline.to_string(), "plugin" => plugin.to_string(), "policy" => policy)
        .increment(1);
}

/// A plugin fault (trap, panic, limit).
pub fn plugin_fault(pipeline: &str, plugin: &str) {
    metrics::counter!("floe_plugin_faults_total", "pipeline" => pipeline.to_string(), "plugin" => plugin.to_string()).increment(1);
}

/// A partition assignment change (`assigned`, `revoked`).
pub fn rebalanced(pipeline: &str, kind: &'static str) {
    metrics::counter!("floe_rebalances_total", "pipeline" => pipeline.to_string(), "kind" => kind)
        .increment(1);
}

/// A commit refused because another writer moved the offsets of our partitions.
pub fn fenced(pipeline: &str) {
    metrics::counter!("floe_fences_total", "pipeline" => pipeline.to_string()).increment(1);
}

/// A transient failure retried, by stage (`commit`, `source`, ...).
pub fn transient_retry(pipeline: &str, stage: &'static str) {
    metrics::counter!("floe_transient_retries_total", "pipeline" => pipeline.to_string(), "stage" => stage)
        .increment(1);
}

/// Records lost to retention before they were read.
pub fn offset_gap(pipeline: &str, records: u64) {
    metrics::counter!("floe_offset_gap_records_total", "pipeline" => pipeline.to_string())
        .increment(records);
}
