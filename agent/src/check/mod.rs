//! `floe check`: tries every pipeline's catalog, table, storage and broker with the
//! configured credentials, loads and initialises its plugins, and reports one
//! pass/fail line per step with the reason. The steps themselves are the stages'
//! probes (`catalog` here, `source::probe`, `transform::probe`).

mod catalog;

use std::fmt::Write as _;

use crate::config::Config;
pub use crate::probe::Outcome;

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

/// Checks every pipeline of `config`: its catalog and table, then its brokers and topics.
pub async fn check(config: &Config) -> Vec<CheckLine> {
    let mut lines = Vec::new();
    for p in &config.pipelines {
        let mut steps = crate::probe::Steps::default();
        let target = catalog::Target {
            catalog: &p.sink.catalog,
            namespace: &p.sink.namespace,
            table: &p.sink.table,
            create_table: p.sink.create_table,
        };
        catalog::probe(&config.catalogs[&p.sink.catalog], &target, &mut steps).await;
        let dead_letter_topic = p.dead_letter.topic.as_deref();
        crate::source::probe::probe(&p.source, dead_letter_topic, &mut steps).await;
        crate::transform::probe::probe(&config.plugins, &p.name, &p.transforms, &mut steps);
        lines.extend(steps.0.into_iter().map(|s| CheckLine {
            pipeline: p.name.clone(),
            step: s.step,
            outcome: s.outcome,
            detail: s.detail,
        }));
    }
    lines
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
