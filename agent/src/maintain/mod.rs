//! Table maintenance: what keeps a table that Floe writes every minute cheap to read and
//! commit to after months.
//!
//! Jobs, in the order one run does them (see `docs/maintenance.md`):
//! - [`compact`]: per partition, bin-packs small data files into files of the target
//!   size and applies position deletes and deletion vectors, so the delete files they
//!   carry disappear; committed as a `replace` snapshot through [`floe_iceberg::commit_rewrite`], which
//!   plans it again on every concurrent commit (carrying that commit's deletes over to
//!   the new files) and carries every pipeline's offsets forward.
//! - [`expire`]: removes old snapshots (beyond the newest `keep_snapshots` and older than
//!   `max_snapshot_age`) and then the files only they referenced; first writes each
//!   pipeline's offsets into the table property that survives expiry.
//! - [`orphans`]: deletes files under the table's location that no snapshot references
//!   and that are older than `orphan_age` (failed uploads, attempts that lost a race).
//! - metadata: keeps `keep_metadata_files` entries in the metadata log and deletes older
//!   metadata files (part of [`expire`]).
//!
//! Runs on a schedule inside `floe run` (`[pipelines.sink.maintenance]`) and on demand
//! with `floe maintain`. Nothing here stops ingestion: a failed run is logged and retried
//! at the next interval.

pub mod compact;

use std::fmt::Write as _;

use floe_iceberg::{expire, orphans};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};
use tokio::sync::watch;

use crate::config::{Config, PipelineConfig};
pub use crate::sink::{MIN_ORPHAN_AGE, MaintenanceConfig};
use floe_iceberg::CatalogHandle;

/// One table to maintain, with its settings.
#[derive(Debug, Clone)]
pub struct Target {
    /// The table.
    pub ident: TableIdent,
    /// The settings.
    pub config: MaintenanceConfig,
    /// Compaction's target size.
    pub target_file_size: u64,
    /// Name prefix of files maintenance writes.
    pub prefix: String,
}

/// The tables of `pipeline` its configuration names (default table and stream tables,
/// or one per listed topic), with its maintenance settings or the defaults.
pub fn targets(pipeline: &PipelineConfig) -> Vec<Target> {
    let names: Vec<String> = if pipeline.sink.table_per_topic() {
        pipeline
            .source
            .topics
            .iter()
            .map(|t| pipeline.sink.table_for_topic(t))
            .collect()
    } else {
        std::iter::once(&pipeline.sink.table)
            .chain(pipeline.sink.streams.values())
            .cloned()
            .collect()
    };
    let namespace = namespace_of(pipeline);
    names
        .into_iter()
        .map(|table| target(pipeline, TableIdent::new(namespace.clone(), table)))
        .collect()
}

fn namespace_of(pipeline: &PipelineConfig) -> NamespaceIdent {
    let namespace = &pipeline.sink.namespace;
    NamespaceIdent::from_vec(namespace.split('.').map(str::to_string).collect())
        .unwrap_or_else(|_| NamespaceIdent::new(namespace.clone()))
}

fn target(pipeline: &PipelineConfig, ident: TableIdent) -> Target {
    let config = pipeline.sink.maintenance.clone().unwrap_or_default();
    Target {
        ident,
        target_file_size: config
            .target_file_size
            .unwrap_or(pipeline.sink.target_file_size),
        config,
        prefix: format!("{}-maintenance", pipeline.name),
    }
}

/// The tables of `pipeline` as they are now: with a table per topic of a
/// `topic_pattern`, also every table of the namespace whose name fits `table` and that
/// the pipeline owns ([`owned_by`]): tables are added as topics appear, and a table of
/// another writer whose name happens to fit is left alone.
pub async fn current_targets(
    pipeline: &PipelineConfig,
    catalog: &CatalogHandle,
) -> Result<Vec<Target>, iceberg::Error> {
    let mut out = targets(pipeline);
    if !pipeline.sink.table_per_topic() || pipeline.source.topic_pattern.is_none() {
        return Ok(out);
    }
    let template = &pipeline.sink.table;
    let (prefix, suffix) = template
        .split_once(crate::sink::TOPIC_PLACEHOLDER)
        .unwrap_or((template, ""));
    let namespace = namespace_of(pipeline);
    let fits = |name: &str| {
        name.len() > prefix.len() + suffix.len()
            && name.starts_with(prefix)
            && name.ends_with(suffix)
            && name[prefix.len()..name.len() - suffix.len()]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut listed = match catalog.catalog.list_tables(&namespace).await {
        Ok(tables) => tables,
        Err(e) if floe_iceberg::is_not_found(&e) => vec![],
        Err(e) => return Err(e),
    };
    listed.sort_by(|a, b| a.name().cmp(b.name()));
    for ident in listed {
        if !fits(ident.name()) || out.iter().any(|t| t.ident == ident) {
            continue;
        }
        let table = match catalog.catalog.load_table(&ident).await {
            Ok(table) => table,
            // Dropped since the listing.
            Err(e) if floe_iceberg::is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        if owned_by(table.metadata().properties(), &pipeline.name) {
            out.push(target(pipeline, ident));
        }
    }
    Ok(out)
}

/// Whether a table with `properties` belongs to `pipeline`: it created the table
/// ([`floe_iceberg::CREATED_BY_PROPERTY`]) or commits to it (its offsets property).
pub fn owned_by(properties: &std::collections::HashMap<String, String>, pipeline: &str) -> bool {
    properties
        .get(floe_iceberg::CREATED_BY_PROPERTY)
        .map(String::as_str)
        == Some(pipeline)
        || properties.contains_key(&floe_iceberg::StoredOffsets::property_key(pipeline))
}

/// What one job did (or, in a dry run, would do).
#[derive(Debug, Clone)]
pub struct JobReport {
    /// `compact`, `expire`, `orphans`, `metadata` (or `list`: the tables could not be listed).
    pub job: &'static str,
    /// One line.
    pub detail: String,
    /// Whether it failed.
    pub failed: bool,
}

/// What a maintenance run did to one table.
#[derive(Debug, Clone)]
pub struct TableReport {
    /// The table.
    pub table: String,
    /// The jobs, in order.
    pub jobs: Vec<JobReport>,
}

/// Errors of maintenance jobs.
#[derive(Debug, thiserror::Error)]
pub enum MaintainError {
    /// Reading or writing the table failed.
    #[error(transparent)]
    Iceberg(#[from] iceberg::Error),
    /// A commit failed.
    #[error(transparent)]
    Commit(#[from] Box<floe_iceberg::CommitFailure>),
    /// Reading delete files or writing new ones failed.
    #[error(transparent)]
    Upsert(#[from] crate::sink::upsert::UpsertError),
    /// An operation of the Iceberg layer failed (delete files, expiry, orphans).
    #[error(transparent)]
    Table(#[from] floe_iceberg::Error),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Runs every job on one table once. A job that fails is reported and the next runs.
pub async fn run_table(catalog: &CatalogHandle, target: &Target, dry_run: bool) -> TableReport {
    let mut report = TableReport {
        table: target.ident.to_string(),
        jobs: Vec::new(),
    };
    let load = || async { catalog.catalog.load_table(&target.ident).await };
    let mut table: Table = match load().await {
        Ok(t) => t,
        Err(e) if floe_iceberg::is_not_found(&e) => {
            report.jobs.push(JobReport {
                job: "load",
                detail: "the table does not exist yet: nothing to do".into(),
                failed: false,
            });
            return report;
        }
        Err(e) => {
            report.jobs.push(JobReport {
                job: "load",
                detail: e.to_string(),
                failed: true,
            });
            return report;
        }
    };
    if target.config.compact {
        let r = compact::compact(catalog, table.clone(), target, dry_run).await;
        report.jobs.push(job("compact", r));
        if let Ok(t) = load().await {
            table = t;
        }
    }
    let options = target.config.expire_options();
    let r = expire::expire(catalog, table.clone(), &options, dry_run).await;
    report
        .jobs
        .push(job("expire", r.map_err(MaintainError::from)));
    if let Ok(t) = load().await {
        table = t;
    }
    let r = expire::trim_metadata(catalog, table.clone(), &options, dry_run).await;
    report
        .jobs
        .push(job("metadata", r.map_err(MaintainError::from)));
    if let Ok(t) = load().await {
        table = t;
    }
    let r = orphans::remove_orphans(&table, load, target.config.orphan_age, dry_run).await;
    report
        .jobs
        .push(job("orphans", r.map_err(MaintainError::from)));
    report
}

fn job(name: &'static str, result: Result<String, MaintainError>) -> JobReport {
    match result {
        Ok(detail) => JobReport {
            job: name,
            detail,
            failed: false,
        },
        Err(e) => JobReport {
            job: name,
            detail: e.to_string(),
            failed: true,
        },
    }
}

/// `floe maintain`: every table of every pipeline (or the ones named `table`, as
/// `name` or `namespace.name`), once.
pub async fn maintain(
    config: &Config,
    table: Option<&str>,
    dry_run: bool,
) -> Result<Vec<TableReport>, floe_iceberg::CatalogError> {
    let mut catalogs = std::collections::HashMap::new();
    let mut reports = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in &config.pipelines {
        if !catalogs.contains_key(&p.sink.catalog) {
            let c = floe_iceberg::open_catalog(&p.sink.catalog, &config.catalogs[&p.sink.catalog])
                .await?;
            catalogs.insert(p.sink.catalog.clone(), c);
        }
        let targets = match current_targets(p, &catalogs[&p.sink.catalog]).await {
            Ok(t) => t,
            Err(e) => {
                reports.push(TableReport {
                    table: format!("{}.{}", p.sink.namespace, p.sink.table),
                    jobs: vec![job("list", Err(MaintainError::Iceberg(e)))],
                });
                continue;
            }
        };
        for target in targets {
            let full = target.ident.to_string();
            if let Some(want) = table
                && want != full
                && want != target.ident.name()
            {
                continue;
            }
            if !seen.insert((p.sink.catalog.clone(), full)) {
                continue;
            }
            reports.push(run_table(&catalogs[&p.sink.catalog], &target, dry_run).await);
        }
    }
    Ok(reports)
}

/// The reports as a table, one line per job.
pub fn render(reports: &[TableReport], dry_run: bool) -> String {
    let mut out = String::new();
    let width = reports
        .iter()
        .map(|r| r.table.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:width$}  {:8}  {:6}  DETAIL",
        "TABLE", "JOB", "RESULT"
    );
    for r in reports {
        for j in &r.jobs {
            let result = if j.failed { "failed" } else { "ok" };
            let _ = writeln!(
                out,
                "{:width$}  {:8}  {:6}  {}",
                r.table, j.job, result, j.detail
            );
        }
    }
    if dry_run {
        out.push_str("dry run: nothing was changed\n");
    }
    out
}

/// Whether every job of every report succeeded.
pub fn all_ok(reports: &[TableReport]) -> bool {
    reports.iter().all(|r| r.jobs.iter().all(|j| !j.failed))
}

/// Runs maintenance on `pipeline`'s tables every `interval` until `shutdown` turns true
/// (inside `floe run`). The first run starts one interval after the start.
pub async fn schedule(
    pipeline: PipelineConfig,
    catalog: CatalogHandle,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(config) = pipeline.sink.maintenance.clone() else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
                continue;
            }
        }
        if *shutdown.borrow() {
            return;
        }
        let targets = match current_targets(&pipeline, &catalog).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(pipeline = %pipeline.name, error = %e, "cannot list the pipeline's tables for maintenance; retried at the next interval");
                continue;
            }
        };
        for target in &targets {
            let started = std::time::Instant::now();
            let report = run_table(&catalog, target, false).await;
            // One line per table and run; a failed job also gets its own warning.
            let mut done = Vec::new();
            for j in &report.jobs {
                if j.failed {
                    tracing::warn!(pipeline = %pipeline.name, table = %report.table, job = j.job, detail = %j.detail, "maintenance job failed; retried at the next interval");
                } else {
                    done.push(format!("{}: {}", j.job, j.detail));
                }
            }
            if !done.is_empty() {
                tracing::info!(pipeline = %pipeline.name, table = %report.table, ms = started.elapsed().as_millis() as u64, "maintenance: {}", done.join("; "));
            }
            crate::telemetry::maintenance(
                &pipeline.name,
                started.elapsed().as_secs_f64(),
                report.jobs.iter().any(|j| j.failed),
            );
        }
    }
}

/// `n` bytes in binary units, for reports.
pub(crate) fn size(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}
