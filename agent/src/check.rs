//! `floe check`: tries every pipeline's catalog, table, storage and broker with the
//! configured credentials, loads and initialises its plugins, and reports one
//! pass/fail line per step with the reason.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use iceberg::table::Table;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableIdent};
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::catalog::rest::{RestCatalog, RestSession};
use crate::catalog::{self, CatalogConfig};
use crate::config::{Config, PipelineConfig};

const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// How one step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It worked.
    Pass,
    /// It failed; the agent would not run.
    Fail,
    /// Not applicable, or not possible because an earlier step failed.
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct CheckLine {
    /// Pipeline name.
    pub pipeline: String,
    /// Step: `catalog`, `token`, `namespaces`, `table`, `storage`, `broker`, `topics`,
    /// `plugin` (one line per configured plugin).
    pub step: &'static str,
    /// Result.
    pub outcome: Outcome,
    /// What was found, or why it failed.
    pub detail: String,
}

/// Checks every pipeline of `config`.
pub async fn check(config: &Config) -> Vec<CheckLine> {
    let mut lines = Vec::new();
    for p in &config.pipelines {
        let mut report = |step, outcome, detail: String| {
            lines.push(CheckLine {
                pipeline: p.name.clone(),
                step,
                outcome,
                detail,
            })
        };
        match &config.catalogs[&p.sink.catalog] {
            CatalogConfig::Rest(rest) => check_rest(p, rest, &mut report).await,
            embedded => check_embedded(p, embedded, &mut report).await,
        }
        check_broker(p, &mut report).await;
        check_plugins(config, p, &mut report);
    }
    lines
}

/// Loads every plugin of the pipeline and runs its `init` with its `with` table.
fn check_plugins(config: &Config, p: &PipelineConfig, report: &mut Report<'_>) {
    use crate::transform::{TransformChain, TransformEngine};
    if p.transforms.is_empty() {
        return;
    }
    let max_memory = p
        .transforms
        .iter()
        .map(|t| t.limits.memory)
        .max()
        .unwrap_or(0);
    let engine = match TransformEngine::new(&config.plugins, p.transforms.len() as u32, max_memory)
    {
        Ok(e) => e,
        Err(e) => return report("plugin", Outcome::Fail, e.to_string()),
    };
    for t in &p.transforms {
        let started = std::time::Instant::now();
        match TransformChain::new(&p.name, &engine, std::slice::from_ref(t)) {
            Ok(_) => report(
                "plugin",
                Outcome::Pass,
                format!(
                    "{}: loaded and initialised with its `with` table ({} ms)",
                    t.display_name(),
                    started.elapsed().as_millis()
                ),
            ),
            Err(e) => report("plugin", Outcome::Fail, e.to_string()),
        }
    }
}

type Report<'a> = dyn FnMut(&'static str, Outcome, String) + 'a;

async fn check_rest(
    p: &PipelineConfig,
    rest: &crate::catalog::rest::RestCatalogConfig,
    report: &mut Report<'_>,
) {
    let session = match RestSession::new(&p.sink.catalog, rest) {
        Ok(s) => s,
        Err(e) => return report("catalog", Outcome::Fail, e.to_string()),
    };
    match session.obtain_token().await {
        Ok(true) => report("token", Outcome::Pass, "token obtained".into()),
        Ok(false) => report("token", Outcome::Skip, "no credential configured".into()),
        Err(e) => {
            report("token", Outcome::Fail, e.to_string());
            return skip_rest(report, "no token");
        }
    }
    let session = match session.configure(rest.warehouse.as_deref()).await {
        Ok(s) => {
            report(
                "catalog",
                Outcome::Pass,
                format!("REST API at {}", s.base()),
            );
            s
        }
        Err(e) => {
            report("catalog", Outcome::Fail, e.to_string());
            return skip_rest(report, "catalog unreachable");
        }
    };
    let catalog: Arc<dyn Catalog> = Arc::new(RestCatalog::new(session, rest.s3.clone()));
    check_catalog(p, catalog, report).await;
}

fn skip_rest(report: &mut Report<'_>, why: &str) {
    for step in ["namespaces", "table", "storage"] {
        report(step, Outcome::Skip, why.into());
    }
}

async fn check_embedded(p: &PipelineConfig, config: &CatalogConfig, report: &mut Report<'_>) {
    match catalog::open_catalog(&p.sink.catalog, config).await {
        Ok(handle) => {
            report("catalog", Outcome::Pass, "embedded catalog opened".into());
            report("token", Outcome::Skip, "embedded catalog: no token".into());
            check_catalog(p, handle.catalog, report).await;
        }
        Err(e) => {
            report("catalog", Outcome::Fail, e.to_string());
            skip_rest(report, "catalog unreachable");
        }
    }
}

async fn check_catalog(p: &PipelineConfig, catalog: Arc<dyn Catalog>, report: &mut Report<'_>) {
    match catalog.list_namespaces(None).await {
        Ok(ns) => report("namespaces", Outcome::Pass, format!("{} listed", ns.len())),
        Err(e) => report("namespaces", Outcome::Fail, e.message().to_string()),
    }
    let levels: Vec<String> = p.sink.namespace.split('.').map(str::to_string).collect();
    let ident = match NamespaceIdent::from_vec(levels) {
        Ok(ns) => TableIdent::new(ns, p.sink.table.clone()),
        Err(e) => return report("table", Outcome::Fail, e.to_string()),
    };
    match catalog.load_table(&ident).await {
        Ok(table) => {
            report(
                "table",
                Outcome::Pass,
                format!(
                    "{ident} loaded ({} snapshots)",
                    table.metadata().snapshots().len()
                ),
            );
            check_storage(&table, report).await;
        }
        Err(e) if e.kind() == ErrorKind::TableNotFound || e.message().contains("No such table") => {
            if p.sink.create_table {
                report(
                    "table",
                    Outcome::Pass,
                    format!(
                        "{ident} does not exist yet; created on the first commit (create_table = true)"
                    ),
                );
                report(
                    "storage",
                    Outcome::Skip,
                    "checked once the table exists (its location and credentials come with it)"
                        .into(),
                );
            } else {
                report(
                    "table",
                    Outcome::Fail,
                    format!("{ident} does not exist; create it or set `create_table = true`"),
                );
                report("storage", Outcome::Skip, "no table".into());
            }
        }
        Err(e) => {
            report("table", Outcome::Fail, e.message().to_string());
            report("storage", Outcome::Skip, "no table".into());
        }
    }
}

/// Writes and deletes a small object under the table's data location, with the
/// credentials the agent would write with.
async fn check_storage(table: &Table, report: &mut Report<'_>) {
    let location = table.metadata().location().trim_end_matches('/');
    let path = format!("{location}/data/.floe-check-{}", uuid::Uuid::now_v7());
    let io = table.file_io();
    let result = async {
        io.new_output(&path)?
            .write(bytes::Bytes::from_static(b"floe check\n"))
            .await?;
        io.delete(&path).await
    }
    .await;
    match result {
        Ok(()) => report(
            "storage",
            Outcome::Pass,
            format!("wrote and deleted {path}"),
        ),
        Err(e) => report(
            "storage",
            Outcome::Fail,
            format!("cannot write {path}: {e}"),
        ),
    }
}

async fn check_broker(p: &PipelineConfig, report: &mut Report<'_>) {
    let config = p.source.client_config();
    let topics = p.source.topics.clone();
    let pattern = p.source.topic_pattern.clone();
    let result = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let present: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        Ok::<_, String>((metadata.brokers().len(), present))
    })
    .await
    .unwrap_or_else(|e| Err(format!("metadata task failed: {e}")));
    let (brokers, present) = match result {
        Ok(r) => r,
        Err(e) => {
            report(
                "broker",
                Outcome::Fail,
                format!("{}: {e}", p.source.bootstrap_servers),
            );
            return report("topics", Outcome::Skip, "broker unreachable".into());
        }
    };
    report(
        "broker",
        Outcome::Pass,
        format!("{brokers} broker(s) at {}", p.source.bootstrap_servers),
    );
    if let Some(pattern) = pattern {
        let matched = regex::Regex::new(&pattern)
            .map(|re| present.iter().filter(|t| re.is_match(t)).count())
            .unwrap_or(0);
        let outcome = if matched > 0 {
            Outcome::Pass
        } else {
            Outcome::Fail
        };
        return report(
            "topics",
            outcome,
            format!("{matched} topic(s) match /{pattern}/"),
        );
    }
    let missing: Vec<&String> = topics.iter().filter(|t| !present.contains(t)).collect();
    if missing.is_empty() {
        report(
            "topics",
            Outcome::Pass,
            format!("present: {}", topics.join(", ")),
        );
    } else {
        let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        report(
            "topics",
            Outcome::Fail,
            format!("missing: {}", names.join(", ")),
        );
    }
}

/// The report as a table, one line per step, and a closing count.
pub fn render(lines: &[CheckLine]) -> String {
    let width = lines
        .iter()
        .map(|l| l.pipeline.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<width$}  {:<10}  {:<6}  DETAIL",
        "PIPELINE", "CHECK", "RESULT"
    );
    for l in lines {
        let result = match l.outcome {
            Outcome::Pass => "ok",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:<10}  {:<6}  {}",
            l.pipeline, l.step, result, l.detail
        );
    }
    let count = |o| lines.iter().filter(|l| l.outcome == o).count();
    let _ = writeln!(
        out,
        "check: {} ok, {} failed, {} skipped",
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::Skip)
    );
    out
}

/// Whether every step passed or was skipped.
pub fn all_passed(lines: &[CheckLine]) -> bool {
    lines.iter().all(|l| l.outcome != Outcome::Fail)
}
