//! `[pipelines.sink.maintenance]`: the settings of a pipeline's table maintenance, part
//! of the sink's section; `crate::maintain` runs the jobs.

use std::time::Duration;

use serde::Deserialize;

/// `[pipelines.sink.maintenance]`: maintenance of the pipeline's tables.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceConfig {
    /// How often `floe run` maintains each table of the pipeline (default 10m).
    #[serde(
        default = "default_interval",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub interval: Duration,
    /// Compact small files and apply deletes (default true).
    #[serde(default = "yes")]
    pub compact: bool,
    /// Size compaction aims for (default: the sink's `target_file_size`).
    #[serde(default, deserialize_with = "optional_size")]
    pub target_file_size: Option<u64>,
    /// A partition is compacted once it has this many small files (smaller than 3/4 of
    /// the target), or any file with deletes (default 5).
    #[serde(default = "default_min_input_files")]
    pub min_input_files: usize,
    /// Snapshots of `main` always kept, newest first (default 10).
    #[serde(default = "default_keep_snapshots")]
    pub keep_snapshots: usize,
    /// Snapshots newer than this are kept too (default 1h; "0s": only `keep_snapshots`).
    #[serde(
        default = "default_max_snapshot_age",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub max_snapshot_age: Duration,
    /// Unreferenced files older than this are deleted (default 3d, at least 1h: a slow
    /// commit's files must not look orphaned).
    #[serde(
        default = "default_orphan_age",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub orphan_age: Duration,
    /// Entries kept in the metadata log; older metadata files are deleted (default 10).
    #[serde(default = "default_keep_metadata_files")]
    pub keep_metadata_files: usize,
}

impl MaintenanceConfig {
    /// What snapshot expiry and metadata trimming keep, in the Iceberg layer's terms.
    pub fn expire_options(&self) -> floe_iceberg::ExpireOptions {
        floe_iceberg::ExpireOptions {
            keep_snapshots: self.keep_snapshots,
            max_snapshot_age: self.max_snapshot_age,
            keep_metadata_files: self.keep_metadata_files,
        }
    }
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: default_interval(),
            compact: true,
            target_file_size: None,
            min_input_files: default_min_input_files(),
            keep_snapshots: default_keep_snapshots(),
            max_snapshot_age: default_max_snapshot_age(),
            orphan_age: default_orphan_age(),
            keep_metadata_files: default_keep_metadata_files(),
        }
    }
}

/// The smallest `orphan_age`.
pub const MIN_ORPHAN_AGE: Duration = Duration::from_secs(3600);

fn default_interval() -> Duration {
    Duration::from_secs(600)
}
fn yes() -> bool {
    true
}
fn default_min_input_files() -> usize {
    5
}
fn default_keep_snapshots() -> usize {
    10
}
fn default_max_snapshot_age() -> Duration {
    Duration::from_secs(3600)
}
fn default_orphan_age() -> Duration {
    Duration::from_secs(3 * 86_400)
}
fn default_keep_metadata_files() -> usize {
    10
}

fn optional_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    crate::settings::size::deserialize(d).map(Some)
}

impl MaintenanceConfig {
    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.interval < Duration::from_secs(1) {
            out.push(("interval".into(), "must be at least 1s".into()));
        }
        if self.keep_snapshots == 0 {
            out.push(("keep_snapshots".into(), "must be at least 1".into()));
        }
        if self.orphan_age < MIN_ORPHAN_AGE {
            out.push((
                "orphan_age".into(),
                "must be at least 1h: files of a commit still in progress must not look orphaned"
                    .into(),
            ));
        }
        if self.keep_metadata_files == 0 {
            out.push(("keep_metadata_files".into(), "must be at least 1".into()));
        }
        if self.min_input_files < 2 {
            out.push(("min_input_files".into(), "must be at least 2".into()));
        }
        if self.target_file_size == Some(0) {
            out.push(("target_file_size".into(), "must be positive".into()));
        }
        out
    }
}
