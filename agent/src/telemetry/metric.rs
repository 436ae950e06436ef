//! Every metric Floe exports: one table ([`METRICS`]: name, type, labels, help) and one
//! function per event. The Grafana dashboard (`examples/grafana/floe.json`), the alert
//! rules, `floe top` and the progress line read these names; tests compare the table
//! with the dashboard's expressions and with a real scrape, so a renamed metric breaks
//! a test rather than a dashboard.
//!
//! Counters end in `_total`; every metric carries a `pipeline` label.

use std::time::Duration;

/// How a metric is exposed in the Prometheus text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (until the process restarts).
    Counter,
    /// A current value.
    Gauge,
    /// Observations in buckets, with `_bucket`, `_sum` and `_count` series.
    Histogram,
}

impl MetricKind {
    /// The name in a `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Full name as scraped (`floe_...`).
    pub name: &'static str,
    /// Type.
    pub kind: MetricKind,
    /// Label names, in the order the functions set them.
    pub labels: &'static [&'static str],
    /// What it counts (the `# HELP` text).
    pub help: &'static str,
}

/// `floe_records_in_total{pipeline}`.
pub const RECORDS_IN: &str = "floe_records_in_total";
/// `floe_records_out_total{pipeline}`.
pub const RECORDS_OUT: &str = "floe_records_out_total";
/// `floe_records_failed_total{pipeline,stage}`.
pub const RECORDS_FAILED: &str = "floe_records_failed_total";
/// `floe_dead_letters_total{pipeline,stage}`.
pub const DEAD_LETTERS: &str = "floe_dead_letters_total";
/// `floe_commits_total{pipeline}`.
pub const COMMITS: &str = "floe_commits_total";
/// `floe_data_files_total{pipeline}`.
pub const DATA_FILES: &str = "floe_data_files_total";
/// `floe_files_closed_early_total{pipeline}`.
pub const FILES_CLOSED_EARLY: &str = "floe_files_closed_early_total";
/// `floe_bytes_committed_total{pipeline}`.
pub const BYTES_COMMITTED: &str = "floe_bytes_committed_total";
/// `floe_commit_seconds{pipeline}`.
pub const COMMIT_SECONDS: &str = "floe_commit_seconds";
/// `floe_seconds_since_last_commit{pipeline}`.
pub const SECONDS_SINCE_LAST_COMMIT: &str = "floe_seconds_since_last_commit";
/// `floe_rows_uncommitted{pipeline}`.
pub const ROWS_UNCOMMITTED: &str = "floe_rows_uncommitted";
/// `floe_seconds_to_next_commit{pipeline}`.
pub const SECONDS_TO_NEXT_COMMIT: &str = "floe_seconds_to_next_commit";
/// `floe_consumer_lag{pipeline,topic,partition}`.
pub const CONSUMER_LAG: &str = "floe_consumer_lag";
/// `floe_partitions_assigned{pipeline}`.
pub const PARTITIONS_ASSIGNED: &str = "floe_partitions_assigned";
/// `floe_fences_total{pipeline}`.
pub const FENCES: &str = "floe_fences_total";
/// `floe_rebalances_total{pipeline,kind}`.
pub const REBALANCES: &str = "floe_rebalances_total";
/// `floe_commit_retries_total{pipeline}`.
pub const COMMIT_RETRIES: &str = floe_iceberg::COMMIT_RETRIES;
/// `floe_transient_retries_total{pipeline,stage}`.
pub const TRANSIENT_RETRIES: &str = "floe_transient_retries_total";
/// `floe_offset_gap_records_total{pipeline}`.
pub const OFFSET_GAP_RECORDS: &str = "floe_offset_gap_records_total";
/// `floe_offset_resets_total{pipeline}`.
pub const OFFSET_RESETS: &str = "floe_offset_resets_total";
/// `floe_plugin_records_in_total{pipeline,plugin}`.
pub const PLUGIN_RECORDS_IN: &str = "floe_plugin_records_in_total";
/// `floe_plugin_records_out_total{pipeline,plugin}`.
pub const PLUGIN_RECORDS_OUT: &str = "floe_plugin_records_out_total";
/// `floe_plugin_records_failed_total{pipeline,plugin,policy}`.
pub const PLUGIN_RECORDS_FAILED: &str = "floe_plugin_records_failed_total";
/// `floe_plugin_faults_total{pipeline,plugin}`.
pub const PLUGIN_FAULTS: &str = "floe_plugin_faults_total";
/// `floe_maintenance_runs_total{pipeline,result}`.
pub const MAINTENANCE_RUNS: &str = "floe_maintenance_runs_total";
/// `floe_maintenance_seconds{pipeline}`.
pub const MAINTENANCE_SECONDS: &str = "floe_maintenance_seconds";
/// `floe_build_info{version}`: always 1.
pub const BUILD_INFO: &str = "floe_build_info";
/// `floe_plugin_batch_seconds{pipeline,plugin}`.
pub const PLUGIN_BATCH_SECONDS: &str = "floe_plugin_batch_seconds";

const P: &[&str] = &["pipeline"];

/// Every metric the agent exports.
pub const METRICS: &[MetricDef] = &[
    MetricDef {
        name: RECORDS_IN,
        kind: MetricKind::Counter,
        labels: P,
        help: "Records read from Kafka.",
    },
    MetricDef {
        name: RECORDS_OUT,
        kind: MetricKind::Counter,
        labels: P,
        help: "Records committed to tables.",
    },
    MetricDef {
        name: RECORDS_FAILED,
        kind: MetricKind::Counter,
        labels: &["pipeline", "stage"],
        help: "Records that did not become rows, by stage (decode, key, transform, schema: dead-lettered; transform_fault: re-read after a plugin fault).",
    },
    MetricDef {
        name: DEAD_LETTERS,
        kind: MetricKind::Counter,
        labels: &["pipeline", "stage"],
        help: "Records written to the dead-letter file, by the stage that rejected them.",
    },
    MetricDef {
        name: COMMITS,
        kind: MetricKind::Counter,
        labels: P,
        help: "Snapshots committed.",
    },
    MetricDef {
        name: FILES_CLOSED_EARLY,
        kind: MetricKind::Counter,
        labels: P,
        help: "Data files closed before their commit because more partitions were written than max_open_files allows (each such file ends smaller than it could).",
    },
    MetricDef {
        name: DATA_FILES,
        kind: MetricKind::Counter,
        labels: P,
        help: "Data files committed.",
    },
    MetricDef {
        name: BYTES_COMMITTED,
        kind: MetricKind::Counter,
        labels: P,
        help: "Bytes of the data files committed.",
    },
    MetricDef {
        name: COMMIT_SECONDS,
        kind: MetricKind::Histogram,
        labels: P,
        help: "Time from the start of a flush to a committed snapshot (write files, commit, retries).",
    },
    MetricDef {
        name: SECONDS_SINCE_LAST_COMMIT,
        kind: MetricKind::Gauge,
        labels: P,
        help: "Age of the newest successful commit (counted from pipeline start until the first one).",
    },
    MetricDef {
        name: ROWS_UNCOMMITTED,
        kind: MetricKind::Gauge,
        labels: P,
        help: "Rows written to data files and waiting for the next commit.",
    },
    MetricDef {
        name: SECONDS_TO_NEXT_COMMIT,
        kind: MetricKind::Gauge,
        labels: P,
        help: "Time until the commit interval ends and the rows waiting are committed.",
    },
    MetricDef {
        name: CONSUMER_LAG,
        kind: MetricKind::Gauge,
        labels: &["pipeline", "topic", "partition"],
        help: "High watermark minus the next offset read, per assigned partition.",
    },
    MetricDef {
        name: PARTITIONS_ASSIGNED,
        kind: MetricKind::Gauge,
        labels: P,
        help: "Partitions the consumer group assigned to this agent.",
    },
    MetricDef {
        name: FENCES,
        kind: MetricKind::Counter,
        labels: P,
        help: "Commits refused by the fence (another writer moved the offsets this commit started from); each costs a re-read.",
    },
    MetricDef {
        name: REBALANCES,
        kind: MetricKind::Counter,
        labels: &["pipeline", "kind"],
        help: "Consumer-group rebalance events, by kind (assigned, revoked, lost).",
    },
    MetricDef {
        name: COMMIT_RETRIES,
        kind: MetricKind::Counter,
        labels: P,
        help: "Commit attempts retried after a catalog conflict or an unknown outcome.",
    },
    MetricDef {
        name: TRANSIENT_RETRIES,
        kind: MetricKind::Counter,
        labels: &["pipeline", "stage"],
        help: "Retries after a transient outage (broker, catalog, storage, registry), by stage.",
    },
    MetricDef {
        name: OFFSET_GAP_RECORDS,
        kind: MetricKind::Counter,
        labels: P,
        help: "Offsets skipped between consecutive records of a partition (compaction, transaction markers, retention).",
    },
    MetricDef {
        name: OFFSET_RESETS,
        kind: MetricKind::Counter,
        labels: P,
        help: "Partitions whose log restarted below the offset stored in the table (a recreated topic, an unclean leader election); the records below it are skipped.",
    },
    MetricDef {
        name: PLUGIN_RECORDS_IN,
        kind: MetricKind::Counter,
        labels: &["pipeline", "plugin"],
        help: "Records given to a plugin.",
    },
    MetricDef {
        name: PLUGIN_RECORDS_OUT,
        kind: MetricKind::Counter,
        labels: &["pipeline", "plugin"],
        help: "Records a plugin emitted.",
    },
    MetricDef {
        name: PLUGIN_RECORDS_FAILED,
        kind: MetricKind::Counter,
        labels: &["pipeline", "plugin", "policy"],
        help: "Records a plugin rejected, by what happened to them (dead_letter, drop, fail).",
    },
    MetricDef {
        name: PLUGIN_FAULTS,
        kind: MetricKind::Counter,
        labels: &["pipeline", "plugin"],
        help: "Plugin faults (trap, panic, fuel or memory limit); each costs a re-read.",
    },
    MetricDef {
        name: PLUGIN_BATCH_SECONDS,
        kind: MetricKind::Histogram,
        labels: &["pipeline", "plugin"],
        help: "Time one plugin spent on one batch.",
    },
    MetricDef {
        name: MAINTENANCE_RUNS,
        kind: MetricKind::Counter,
        labels: &["pipeline", "result"],
        help: "Scheduled maintenance runs of a table (ok, failed).",
    },
    MetricDef {
        name: MAINTENANCE_SECONDS,
        kind: MetricKind::Histogram,
        labels: &["pipeline"],
        help: "Duration of one scheduled maintenance run of a table.",
    },
    MetricDef {
        name: BUILD_INFO,
        kind: MetricKind::Gauge,
        labels: &["version"],
        help: "Always 1; the version label says which Floe runs.",
    },
];

/// The stages of `floe_records_failed_total` and `floe_dead_letters_total`, exported at
/// zero from a pipeline's start.
const FAILURE_STAGES: [&str; 4] = ["decode", "key", "schema", "transform"];
/// Histogram buckets (seconds) of [`MAINTENANCE_SECONDS`].
pub const MAINTENANCE_SECONDS_BUCKETS: &[f64] =
    &[0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0];

/// Histogram buckets (seconds) of [`COMMIT_SECONDS`].
pub const COMMIT_SECONDS_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Histogram buckets (seconds) of [`PLUGIN_BATCH_SECONDS`].
pub const PLUGIN_BATCH_SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The definition of `name`, if Floe exports it.
pub fn find(name: &str) -> Option<&'static MetricDef> {
    METRICS.iter().find(|m| m.name == name)
}

/// Registers the per-pipeline series at zero, so dashboards and `rate()` see them from
/// the start (called by [`crate::telemetry::health::pipeline_started`]).
pub fn register_pipeline(pipeline: &str) {
    for m in METRICS.iter().filter(|m| m.labels == P) {
        let labels = [("pipeline", pipeline.to_string())];
        match m.kind {
            MetricKind::Counter => metrics::counter!(m.name, &labels).increment(0),
            // Gauges and histograms are set by their events; zero would be a false value.
            MetricKind::Gauge | MetricKind::Histogram => {}
        }
    }
    for stage in FAILURE_STAGES {
        for name in [RECORDS_FAILED, DEAD_LETTERS] {
            metrics::counter!(name, "pipeline" => pipeline.to_string(), "stage" => stage)
                .increment(0);
        }
    }
}

/// Sets `floe_build_info{version} 1`.
pub fn build_info() {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// One scheduled maintenance run of a table.
pub fn maintenance(pipeline: &str, seconds: f64, failed: bool) {
    let result = if failed { "failed" } else { "ok" };
    metrics::counter!(MAINTENANCE_RUNS, "pipeline" => pipeline.to_string(), "result" => result)
        .increment(1);
    metrics::histogram!(MAINTENANCE_SECONDS, &pipeline_label(pipeline)).record(seconds);
}

fn pipeline_label(pipeline: &str) -> [(&'static str, String); 1] {
    [("pipeline", pipeline.to_string())]
}

/// Records read from Kafka.
pub fn records_in(pipeline: &str, n: u64) {
    metrics::counter!(RECORDS_IN, &pipeline_label(pipeline)).increment(n);
}

/// Records committed to the table.
pub fn records_out(pipeline: &str, n: u64) {
    metrics::counter!(RECORDS_OUT, &pipeline_label(pipeline)).increment(n);
}

/// A record that did not become a row, by the stage that rejected it.
pub fn records_failed(pipeline: &str, stage: &'static str) {
    metrics::counter!(RECORDS_FAILED, "pipeline" => pipeline.to_string(), "stage" => stage)
        .increment(1);
}

/// A record written to the dead-letter file, by the stage that rejected it.
pub fn dead_letter(pipeline: &str, stage: &'static str) {
    metrics::counter!(DEAD_LETTERS, "pipeline" => pipeline.to_string(), "stage" => stage)
        .increment(1);
}

/// Age of the newest successful commit.
pub fn seconds_since_last_commit(pipeline: &str, seconds: f64) {
    metrics::gauge!(SECONDS_SINCE_LAST_COMMIT, &pipeline_label(pipeline)).set(seconds);
}

/// Rows written and waiting for the next commit, and the time until that commit.
pub fn uncommitted_rows(pipeline: &str, rows: u64) {
    metrics::gauge!(ROWS_UNCOMMITTED, &pipeline_label(pipeline)).set(rows as f64);
}

/// Time until the current commit interval ends.
pub fn seconds_to_next_commit(pipeline: &str, seconds: f64) {
    metrics::gauge!(SECONDS_TO_NEXT_COMMIT, &pipeline_label(pipeline)).set(seconds);
}

/// A commit finished: snapshot count and data files.
pub fn committed(pipeline: &str, files: usize) {
    metrics::counter!(COMMITS, &pipeline_label(pipeline)).increment(1);
    metrics::counter!(DATA_FILES, &pipeline_label(pipeline)).increment(files as u64);
}

/// Data files closed early: more partitions written than `max_open_files`.
pub fn files_closed_early(pipeline: &str, n: u64) {
    metrics::counter!(FILES_CLOSED_EARLY, &pipeline_label(pipeline)).increment(n);
}

/// Bytes of the data files a commit added (their `file_size_in_bytes`).
pub fn bytes_committed(pipeline: &str, bytes: u64) {
    metrics::counter!(BYTES_COMMITTED, &pipeline_label(pipeline)).increment(bytes);
}

/// Time from the start of a flush to its committed snapshot.
pub fn commit_duration(pipeline: &str, spent: Duration) {
    metrics::histogram!(COMMIT_SECONDS, &pipeline_label(pipeline)).record(spent.as_secs_f64());
}

/// Consumer lag of one partition.
pub fn consumer_lag(pipeline: &str, topic: &str, partition: i32, lag: i64) {
    metrics::gauge!(CONSUMER_LAG, "pipeline" => pipeline.to_string(), "topic" => topic.to_string(), "partition" => partition.to_string())
        .set(lag as f64);
}

/// How many partitions the group assigned to this agent now (also sets
/// [`crate::telemetry::health`]'s view; call [`crate::telemetry::health::partitions_assigned`]
/// instead of this when both are wanted).
pub fn partitions(pipeline: &str, n: usize) {
    metrics::gauge!(PARTITIONS_ASSIGNED, &pipeline_label(pipeline)).set(n as f64);
}

/// A commit refused by the fence.
pub fn fenced(pipeline: &str) {
    metrics::counter!(FENCES, &pipeline_label(pipeline)).increment(1);
}

/// A rebalance event: `kind` is `assigned`, `revoked` or `lost`.
pub fn rebalanced(pipeline: &str, kind: &'static str) {
    metrics::counter!(REBALANCES, "pipeline" => pipeline.to_string(), "kind" => kind).increment(1);
}

/// A commit attempt retried (catalog conflict or unknown outcome).
pub fn commit_retry(pipeline: &str) {
    metrics::counter!(COMMIT_RETRIES, &pipeline_label(pipeline)).increment(1);
}

/// A retry after a transient outage in `stage` (`source`, `catalog`, `storage`,
/// `registry`, ...). [`crate::telemetry::health::transient_failure`] counts it too.
pub fn transient_retry(pipeline: &str, stage: &'static str) {
    metrics::counter!(TRANSIENT_RETRIES, "pipeline" => pipeline.to_string(), "stage" => stage)
        .increment(1);
}

/// `n` records removed from Kafka (retention, DeleteRecords) before they were read.
pub fn offset_gap(pipeline: &str, n: u64) {
    metrics::counter!(OFFSET_GAP_RECORDS, &pipeline_label(pipeline)).increment(n);
}

/// A partition's log restarted below the stored offset.
pub fn offset_reset(pipeline: &str) {
    metrics::counter!(OFFSET_RESETS, &pipeline_label(pipeline)).increment(1);
}

/// One batch through one plugin: records in and out, and time spent.
pub fn plugin_batch(
    pipeline: &str,
    plugin: &str,
    records_in: usize,
    records_out: usize,
    spent: Duration,
) {
    let labels = [
        ("pipeline", pipeline.to_string()),
        ("plugin", plugin.to_string()),
    ];
    metrics::counter!(PLUGIN_RECORDS_IN, &labels).increment(records_in as u64);
    metrics::counter!(PLUGIN_RECORDS_OUT, &labels).increment(records_out as u64);
    metrics::histogram!(PLUGIN_BATCH_SECONDS, &labels).record(spent.as_secs_f64());
}

/// A record a plugin rejected, by what happened to it (`dead_letter`, `drop`, `fail`).
pub fn plugin_record_error(pipeline: &str, plugin: &str, policy: &'static str) {
    metrics::counter!(PLUGIN_RECORDS_FAILED, "pipeline" => pipeline.to_string(), "plugin" => plugin.to_string(), "policy" => policy)
        .increment(1);
}

/// A plugin fault (trap, panic, limit).
pub fn plugin_fault(pipeline: &str, plugin: &str) {
    metrics::counter!(PLUGIN_FAULTS, "pipeline" => pipeline.to_string(), "plugin" => plugin.to_string()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::scrape::Exposition;

    /// Calls every function above once against a private recorder and renders it.
    fn render_all() -> String {
        let recorder = crate::telemetry::builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            crate::telemetry::describe();
            register_pipeline("p");
            records_in("p", 3);
            records_out("p", 2);
            records_failed("p", "decode");
            dead_letter("p", "decode");
            seconds_since_last_commit("p", 1.5);
            uncommitted_rows("p", 40);
            seconds_to_next_commit("p", 12.0);
            committed("p", 1);
            bytes_committed("p", 1024);
            commit_duration("p", Duration::from_millis(30));
            consumer_lag("p", "t", 0, 5);
            partitions("p", 4);
            fenced("p");
            rebalanced("p", "assigned");
            commit_retry("p");
            transient_retry("p", "catalog");
            offset_gap("p", 2);
            plugin_batch("p", "f", 10, 8, Duration::from_micros(300));
            plugin_record_error("p", "f", "drop");
            plugin_fault("p", "f");
            maintenance("p", 0.3, false);
            build_info();
        });
        handle.render()
    }

    #[test]
    fn every_function_exports_exactly_the_table() {
        let text = render_all();
        let exposition = Exposition::parse(&text).expect("parses");
        let mut exported: Vec<(&str, &str)> = exposition
            .families()
            .map(|(name, kind)| (name, kind.unwrap_or("untyped")))
            .collect();
        exported.sort();
        let mut table: Vec<(&str, &str)> =
            METRICS.iter().map(|m| (m.name, m.kind.as_str())).collect();
        table.sort();
        assert_eq!(exported, table, "rendered:\n{text}");
        for m in METRICS {
            assert!(
                text.contains(&format!("# HELP {} {}", m.name, m.help)),
                "no help for {}",
                m.name
            );
            let sample = exposition
                .samples()
                .iter()
                .find(|s| s.metric == m.name || s.metric.strip_suffix("_count") == Some(m.name))
                .unwrap_or_else(|| panic!("no sample of {}", m.name));
            let mut labels: Vec<&str> = sample
                .labels
                .keys()
                .map(String::as_str)
                .filter(|l| *l != "le")
                .collect();
            labels.sort();
            let mut want = m.labels.to_vec();
            want.sort();
            assert_eq!(labels, want, "labels of {}", m.name);
        }
    }

    #[test]
    fn every_metric_is_in_the_operations_reference() {
        let doc = include_str!("../../../docs/operations.md");
        for m in METRICS {
            assert!(
                doc.contains(&format!("| `{}` |", m.name)),
                "docs/operations.md lists no row for {}",
                m.name
            );
        }
    }

    #[test]
    fn names_follow_the_conventions() {
        for m in METRICS {
            assert!(m.name.starts_with("floe_"), "{}", m.name);
            assert_eq!(
                m.kind == MetricKind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
            if m.name != BUILD_INFO {
                assert_eq!(m.labels.first(), Some(&"pipeline"), "{}", m.name);
            }
            assert!(m.help.ends_with('.'), "{}", m.name);
        }
    }
}
