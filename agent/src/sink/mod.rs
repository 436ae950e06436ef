//! Sink stage: the table writer. Rows stream into Parquet data files as they arrive;
//! every commit interval the files written since the last commit (and, in upsert mode,
//! the deletes of the rows they replace) are handed to [`floe_iceberg::commit`] as one snapshot.
//!
//! - `table`: loads or creates the target table, evolves its schema, streams rows into
//!   files and commits them as one snapshot that carries the Kafka offsets.
//! - `stream`: the open data files of a table (row groups flushed to storage as they
//!   fill, files rolled at the target size, a bounded number open).
//! - `upsert`: one row per key: key index, last-per-key reduction, position deletes or
//!   deletion vectors.
//! - `partition`: the partition spec of created tables; the check that a table's spec
//!   can be written.
//! - `writer`: Parquet data files written in one go (compaction), one partition at a time.

mod maintenance;
pub mod partition;
pub mod stream;
mod table;
pub mod upsert;
pub mod writer;

use std::time::Duration;

use serde::Deserialize;

pub use maintenance::{MIN_ORPHAN_AGE, MaintenanceConfig};
pub use table::{CommitOutcome, TableSink};

/// The placeholder in `table` that names a table after each topic.
pub const TOPIC_PLACEHOLDER: &str = "{topic}";

/// How long one commit attempt may take (the catalog call with its own retries, such as
/// waiting out 429s): past it the attempt counts as failed, and the next one finds out
/// whether it landed (the offsets fence).
pub const COMMIT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long a pipeline keeps retrying a commit that fails before it stops: its files
/// are then never committed (they are read again at the next start).
pub const COMMIT_GIVE_UP: Duration = Duration::from_secs(3600);

/// The longest `commit_interval`.
pub const MAX_COMMIT_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Why `name` cannot name a table, if it cannot: a table name is one path segment of the
/// warehouse, so it holds no separator, no control character and is not `.` or `..`.
fn table_name_problem(name: &str) -> Option<String> {
    if name.contains(['/', '\\']) {
        return Some(format!(
            "{name:?} holds a path separator: a table name is one name (use `namespace` for levels)"
        ));
    }
    if name.chars().any(char::is_control) {
        return Some(format!("{name:?} holds a control character"));
    }
    if name.len() > 255 {
        return Some(format!(
            "is {} bytes long: a table's directory name holds at most 255",
            name.len()
        ));
    }
    if name.trim() != name || name == "." || name == ".." {
        return Some(format!("{name:?} is not a usable table name"));
    }
    None
}

/// The youngest an unreferenced file may be for orphan cleanup to delete it, for a
/// pipeline committing every `commit_interval`: a file written at the start of an
/// interval is committed (or given up) at most `commit_interval` +
/// [`COMMIT_GIVE_UP`] + [`COMMIT_ATTEMPT_TIMEOUT`] later.
pub fn min_orphan_age(commit_interval: Duration) -> Duration {
    (commit_interval + COMMIT_GIVE_UP + COMMIT_ATTEMPT_TIMEOUT).max(MIN_ORPHAN_AGE)
}

/// `[pipelines.sink]`: target table and commit policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    /// Name of a `[catalogs.NAME]` entry.
    pub catalog: String,
    /// Namespace; dots separate levels (`analytics.raw`).
    pub namespace: String,
    /// Table name. With `{topic}` in it, each topic gets its own table:
    /// `table = "raw_{topic}"` writes topic `orders.eu` to `raw_orders_eu` (characters
    /// other than letters, digits and `_` become `_`). With `topic_pattern`, a table is
    /// added when a new matching topic is assigned; each table stores the offsets of its
    /// own topic only.
    pub table: String,
    /// Tables of named output streams (plugins route records with `Emit::to(stream, ...)`):
    /// `streams = { eu = "events_eu" }`, in the same namespace. A record routed to a
    /// stream not listed here goes to the dead-letter file.
    #[serde(default)]
    pub streams: std::collections::BTreeMap<String, String>,
    /// A `_kafka_topic` column (the topic each row was read from) in tables the agent
    /// creates. Default: on when records of several topics can reach one table
    /// (`topic_pattern` or several `topics`, without `{topic}` in `table`). A table
    /// that exists gets the topic only if it has the column (add it with your engine's
    /// `ALTER TABLE ... ADD COLUMN _kafka_topic string`).
    #[serde(default)]
    pub topic_column: Option<bool>,
    /// A `_kafka_headers` column (map of header name to value bytes) in tables the agent
    /// creates (default false). A header name that repeats keeps its last value. A table
    /// that exists gets the headers only if it has the column.
    #[serde(default)]
    pub headers_column: bool,
    /// Create the namespace and table (from the first records' schema) if missing.
    /// Off by default: production jobs rarely hold the privilege to create tables.
    #[serde(default)]
    pub create_table: bool,
    /// `append`: every message becomes a row; `upsert`: one row per `key`.
    #[serde(default)]
    pub mode: Mode,
    /// Upsert key: top-level fields of the (transformed) value, e.g. `["id"]`, or
    /// `["_kafka_key"]` for the Kafka message key (then a tombstone deletes the row).
    #[serde(default)]
    pub key: Vec<String>,
    /// Upsert mode: most live keys allowed; past it the pipeline stops with an error.
    /// Default: no bound (the key index spills to `index_dir`, memory stays within
    /// `index_memory`).
    #[serde(default)]
    pub max_keys: Option<u64>,
    /// Upsert mode: memory of each table's key index (default 256MiB): its newest
    /// entries, and the Bloom filters and block fences of the entries on disk.
    #[serde(
        default = "default_index_memory",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub index_memory: u64,
    /// Upsert mode: where each table's key index is kept
    /// (`<index_dir>/<pipeline>/<table uuid>/`; default `.floe/index`). Kept across
    /// restarts, so a start catches up from it instead of reading every key of the
    /// table; when missing or stale it is rebuilt from the table.
    #[serde(default = "default_index_dir")]
    pub index_dir: std::path::PathBuf,
    /// How often the files written since the last commit are committed as one snapshot
    /// (default 60s, at least 1s): a table gets one snapshot per interval.
    #[serde(
        default = "default_commit_interval",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub commit_interval: Duration,
    /// Commit before the interval is up once this much data (records as read: values
    /// and keys) is written to files but not committed (default 4GiB). While the catalog
    /// cannot be reached the agent keeps writing files up to this bound, then stops
    /// reading until a commit lands.
    #[serde(
        default = "default_max_uncommitted_bytes",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub max_uncommitted_bytes: u64,
    /// No longer used: rows stream into files and commits follow `commit_interval` (and
    /// `max_uncommitted_bytes`). Accepted with a warning so older configs still load.
    #[serde(
        default,
        deserialize_with = "crate::settings::size::deserialize_option"
    )]
    pub flush_bytes: Option<u64>,
    /// No longer used (see `flush_bytes`).
    #[serde(default)]
    pub flush_records: Option<usize>,
    /// Roll to a new Parquet file past this size (default 512MiB).
    #[serde(
        default = "default_target_file_size",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub target_file_size: u64,
    /// A Parquet row group is flushed to storage past this size (default 32MiB): what an
    /// open file holds in memory.
    #[serde(
        default = "default_row_group_bytes",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub row_group_bytes: u64,
    /// Data files open at once per table (one per partition written to; default 8).
    /// Past it the least recently written one is closed early
    /// (`floe_files_closed_early_total`).
    #[serde(default = "default_max_open_files")]
    pub max_open_files: usize,
    /// Partition spec of a table the agent creates, e.g. `["day(ts)", "bucket(16, id)"]`
    /// (see [`partition`]); a table that exists keeps its own spec.
    #[serde(default)]
    pub partition_by: Vec<String>,
    /// Iceberg format version of a table the agent creates: 2 (default; upsert writes
    /// position-delete files) or 3 (upsert writes deletion vectors).
    #[serde(default = "default_format_version")]
    pub format_version: u8,
    /// Where a table the agent creates is placed: `<location>/<table>` (for example
    /// `s3://bucket/lake/shop`). Default: under the namespace's `location` property when
    /// it has one, else where the catalog puts it (some REST catalogs, AWS Glue's
    /// among them, need a location on create).
    #[serde(default)]
    pub location: Option<String>,
    /// Table maintenance run by the agent (compaction, snapshot expiry, cleanup); off
    /// when absent.
    #[serde(default)]
    pub maintenance: Option<MaintenanceConfig>,
}

/// Write mode.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every message is a row, with `_kafka_partition`, `_kafka_offset`, `_kafka_timestamp`, `_kafka_key`.
    #[default]
    Append,
    /// One row per key: later messages replace the row, tombstones delete it
    /// (position deletes; see [`upsert`]).
    Upsert,
}

fn default_format_version() -> u8 {
    2
}

fn default_index_memory() -> u64 {
    256 << 20
}

fn default_index_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(".floe/index")
}

fn default_commit_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_max_uncommitted_bytes() -> u64 {
    4 * 1024 * 1024 * 1024
}
fn default_row_group_bytes() -> u64 {
    32 * 1024 * 1024
}
fn default_max_open_files() -> usize {
    8
}
fn default_target_file_size() -> u64 {
    512 * 1024 * 1024
}

impl SinkConfig {
    /// Whether each topic gets its own table (`{topic}` in `table`).
    pub fn table_per_topic(&self) -> bool {
        self.table.contains(TOPIC_PLACEHOLDER)
    }

    /// The table of `topic` when each topic gets its own table.
    pub fn table_for_topic(&self, topic: &str) -> String {
        let name: String = topic
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.table.replace(TOPIC_PLACEHOLDER, &name)
    }

    /// Settings that still load but no longer do anything, as `(field, message)` pairs.
    pub fn warnings(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (field, set) in [
            ("flush_bytes", self.flush_bytes.is_some()),
            ("flush_records", self.flush_records.is_some()),
        ] {
            if set {
                out.push((
                    field.to_string(),
                    "no longer used: rows stream into data files and a table gets one snapshot per commit_interval (or past max_uncommitted_bytes); remove it".to_string(),
                ));
            }
        }
        out
    }

    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.commit_interval < Duration::from_secs(1) {
            out.push(("commit_interval".into(), "must be at least 1s".into()));
        }
        if self.commit_interval > MAX_COMMIT_INTERVAL {
            out.push((
                "commit_interval".into(),
                format!(
                    "must be at most {}: until a commit, Kafka keeps what is not in the table",
                    humantime::format_duration(MAX_COMMIT_INTERVAL)
                ),
            ));
        }
        if self.max_uncommitted_bytes == 0 {
            out.push(("max_uncommitted_bytes".into(), "must be positive".into()));
        }
        if self.row_group_bytes < 64 * 1024 {
            out.push(("row_group_bytes".into(), "must be at least 64KiB".into()));
        }
        if self.max_open_files == 0 {
            out.push(("max_open_files".into(), "must be at least 1".into()));
        }
        if self.index_memory < 64 * 1024 {
            out.push(("index_memory".into(), "must be at least 64KiB".into()));
        }
        match self.mode {
            Mode::Upsert if self.key.is_empty() => out.push((
                "key".into(),
                "upsert mode needs a key: field names, or [\"_kafka_key\"] for the message key"
                    .into(),
            )),
            Mode::Upsert
                if self.key.len() > 1 && self.key.iter().any(|k| k == upsert::MESSAGE_KEY) =>
            {
                out.push((
                    "key".into(),
                    "`_kafka_key` cannot be combined with payload fields".into(),
                ))
            }
            Mode::Append if !self.key.is_empty() => {
                out.push(("key".into(), "only used with mode = \"upsert\"".into()))
            }
            _ => {}
        }
        if self.table.trim().is_empty() {
            out.push(("table".into(), "must not be empty".into()));
        } else if let Some(why) = table_name_problem(&self.table) {
            out.push(("table".into(), why));
        }
        if self.table_per_topic() && !self.streams.is_empty() {
            out.push((
                "streams".into(),
                "cannot be combined with a table per topic (`{topic}` in `table`)".into(),
            ));
        }
        for (stream, table) in &self.streams {
            if table.trim().is_empty() {
                out.push((
                    format!("streams.{stream}"),
                    "table name must not be empty".into(),
                ));
            } else if table == &self.table {
                out.push((
                    format!("streams.{stream}"),
                    "must differ from the pipeline's default table".into(),
                ));
            } else if let Some(why) = table_name_problem(table) {
                out.push((format!("streams.{stream}"), why));
            }
        }
        if self
            .location
            .as_deref()
            .is_some_and(|l| l.trim_end_matches('/').is_empty())
        {
            out.push(("location".into(), "must name a directory or prefix".into()));
        }
        if !matches!(self.format_version, 2 | 3) {
            out.push(("format_version".into(), "must be 2 or 3".into()));
        }
        out.extend(partition::parse_all(&self.partition_by).1);
        // (Below MIN_ORPHAN_AGE the maintenance section reports it itself.)
        if let Some(m) = &self.maintenance
            && m.orphan_age >= MIN_ORPHAN_AGE
            && m.orphan_age < min_orphan_age(self.commit_interval)
        {
            out.push((
                "maintenance.orphan_age".into(),
                format!(
                    "must be at least {} with commit_interval = {}: a file written during an interval may be committed up to commit_interval + {} later, and must not look orphaned before",
                    humantime::format_duration(min_orphan_age(self.commit_interval)),
                    humantime::format_duration(self.commit_interval),
                    humantime::format_duration(COMMIT_GIVE_UP + COMMIT_ATTEMPT_TIMEOUT),
                ),
            ));
        }
        if let Some(m) = &self.maintenance {
            out.extend(
                m.problems()
                    .into_iter()
                    .map(|(f, msg)| (format!("maintenance.{f}"), msg)),
            );
        }
        if self.namespace.split('.').any(|p| p.trim().is_empty()) {
            out.push((
                "namespace".into(),
                "must be non-empty names separated by '.'".into(),
            ));
        }
        out
    }
}

/// Errors of the sink stage.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The target table does not exist and `create_table` is off.
    #[error("table {0} does not exist; create it or set `create_table = true`")]
    MissingTable(String),
    /// The table cannot be written as configured (partition spec, format version).
    #[error("{0}")]
    Unwritable(String),
    /// Another writer committed offsets of this pipeline; our commit was refused.
    #[error("commit fenced: {0}")]
    Fenced(String),
    /// Stored offsets could not be read.
    #[error(transparent)]
    Offsets(#[from] floe_iceberg::OffsetsError),
    /// The records could not be turned into Arrow batches.
    #[error(transparent)]
    Batch(#[from] crate::batch::BatchError),
    /// The schema could not be built.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// Any other catalog or storage error.
    #[error("Iceberg {operation} failed for {table}: {source}")]
    Iceberg {
        /// What we were doing.
        operation: &'static str,
        /// Table identifier.
        table: String,
        /// The cause.
        source: Box<iceberg::Error>,
    },
    /// Upsert mode failed (key index, delete files, table shape).
    #[error(transparent)]
    Upsert(#[from] upsert::UpsertError),
    /// A snapshot commit failed (after retries where they could help).
    #[error(transparent)]
    Commit(Box<floe_iceberg::CommitFailure>),
    /// Other writers kept changing the table under a commit: try again later.
    #[error("{0}")]
    Contended(String),
    /// A commit attempt did not finish in time (or before a stop's grace ran out).
    #[error(
        "the commit to {0} did not finish in time: the next attempt finds out whether it landed"
    )]
    TimedOut(String),
    /// Something that cannot happen did (a bug: please report).
    #[error("internal error: {0}; please report this")]
    Internal(String),
}

impl SinkError {
    /// Whether a file of the table was missing (the table view was stale).
    pub fn is_missing_file(&self) -> bool {
        use crate::error::is_missing_file;
        match self {
            SinkError::Iceberg { source, .. } => is_missing_file(source),
            SinkError::Upsert(upsert::UpsertError::Iceberg(e)) => is_missing_file(e),
            SinkError::Commit(failure) => match failure.as_ref() {
                floe_iceberg::CommitFailure::Iceberg { source, .. } => is_missing_file(source),
                _ => false,
            },
            _ => false,
        }
    }
}

impl crate::error::Classify for SinkError {
    fn class(&self) -> crate::error::ErrorClass {
        use crate::error::ErrorClass::*;
        if self.is_missing_file() {
            // A file of a stale table view (expired by another writer): reloading helps.
            return Transient;
        }
        match self {
            SinkError::Iceberg { source, .. } => crate::error::iceberg_class(source),
            SinkError::Commit(failure) => failure.class().into(),
            SinkError::Upsert(upsert::UpsertError::Iceberg(e)) => crate::error::iceberg_class(e),
            SinkError::Upsert(upsert::UpsertError::Parquet(_)) => Transient,
            SinkError::Fenced(_) | SinkError::Contended(_) | SinkError::TimedOut(_) => Transient,
            SinkError::MissingTable(_)
            | SinkError::Unwritable(_)
            | SinkError::Offsets(_)
            | SinkError::Batch(_)
            | SinkError::Schema(_)
            | SinkError::Upsert(_)
            | SinkError::Internal(_) => Fatal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_limits() {
        let c: SinkConfig =
            toml::from_str("catalog = \"local\"\nnamespace = \"a.b\"\ntable = \"t\"").unwrap();
        assert_eq!(c.commit_interval, Duration::from_secs(60));
        assert_eq!(c.max_uncommitted_bytes, 4 << 30);
        assert_eq!((c.row_group_bytes, c.max_open_files), (32 << 20, 8));
        assert!(!c.create_table);
        assert!(c.problems().is_empty() && c.warnings().is_empty());
        let c: SinkConfig = toml::from_str("catalog = \"l\"\nnamespace = \"a..b\"\ntable = \"t\"\ncommit_interval = \"500ms\"\nmax_uncommitted_bytes = \"1KiB\"").unwrap();
        assert_eq!(c.max_uncommitted_bytes, 1024);
        let fields: Vec<_> = c.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(fields, ["commit_interval", "namespace"]);
        let e = toml::from_str::<SinkConfig>(
            "catalog = \"l\"\nnamespace = \"n\"\ntable = \"t\"\ncommit_interval = \"soon\"",
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid duration"), "{e}");
    }

    /// A config written for the size-triggered commits still loads, with a warning.
    /// Orphan cleanup must not reach files that wait for their interval's commit.
    #[test]
    fn orphan_age_covers_the_commit_interval_and_its_retries() {
        let config = |interval: &str, age: &str| -> SinkConfig {
            toml::from_str(&format!(
                "catalog = \"l\"\nnamespace = \"a\"\ntable = \"t\"\ncommit_interval = \"{interval}\"\n[maintenance]\norphan_age = \"{age}\""
            ))
            .unwrap()
        };
        let fields = |c: &SinkConfig| c.problems().into_iter().map(|(f, _)| f).collect::<Vec<_>>();
        assert!(fields(&config("2h", "3h")).contains(&"maintenance.orphan_age".to_string()));
        assert!(fields(&config("2h", "3h10m")).is_empty());
        assert!(fields(&config("1m", "2h")).is_empty());
        assert_eq!(
            min_orphan_age(Duration::from_secs(60)),
            Duration::from_secs(60 + 3600 + 300)
        );
    }

    #[test]
    fn flush_settings_load_with_a_warning() {
        let c: SinkConfig = toml::from_str(
            "catalog = \"l\"\nnamespace = \"n\"\ntable = \"t\"\nflush_bytes = \"32MiB\"\nflush_records = 1000",
        )
        .unwrap();
        assert!(c.problems().is_empty());
        let fields: Vec<_> = c.warnings().into_iter().map(|w| w.0).collect();
        assert_eq!(fields, ["flush_bytes", "flush_records"]);
    }
}
