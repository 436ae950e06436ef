//! What `/readyz` answers: a small registry the pipelines report to.
//!
//! A pipeline calls, in this order of its life:
//! - [`pipeline_started`] when it starts (before opening its tables);
//! - [`partitions_assigned`] after every assignment change, with the number it owns now;
//! - [`table_committed`] after each snapshot committed to a table, and [`flush_completed`]
//!   after every flush round that ended with nothing left to commit (also when there was
//!   nothing to commit), so an idle topic stays ready;
//! - [`transient_failure`] each time it retries a transient outage, and [`recovered`]
//!   once the retried step succeeds;
//! - [`pipeline_stopped`] when it stops, with the error if it failed.
//!
//! The agent is ready when at least one pipeline was started and every pipeline is
//! running, owns at least one partition, is not retrying an outage, and each of its
//! tables was brought up to date (committed, or found with nothing to commit) within
//! `ready_commit_intervals` commit intervals. `/healthz` only says the process answers.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard)
}

/// A pipeline starts; `commit_interval` is its `[pipelines.sink] commit_interval`.
/// Also registers its per-pipeline metrics at zero.
pub fn pipeline_started(pipeline: &str, commit_interval: Duration) {
    super::metric::register_pipeline(pipeline);
    super::metric::partitions(pipeline, 0);
    with(|r| r.started(pipeline, commit_interval, Instant::now()));
}

/// The consumer group now assigns `n` partitions to this pipeline (0 after a revocation).
/// Also sets `floe_partitions_assigned`.
pub fn partitions_assigned(pipeline: &str, n: usize) {
    super::metric::partitions(pipeline, n);
    with(|r| r.entry(pipeline).partitions = n);
}

/// A snapshot was committed to `table` (any name that identifies it, e.g. `ns.table`).
pub fn table_committed(pipeline: &str, table: &str) {
    let now = Instant::now();
    with(|r| {
        r.entry(pipeline).tables.insert(table.to_string(), now);
    });
}

/// A flush round ended with every table committed or with nothing to commit: all the
/// pipeline's tables are up to date.
pub fn flush_completed(pipeline: &str) {
    let now = Instant::now();
    with(|r| r.entry(pipeline).last_round = Some(now));
}

/// The pipeline retries a transient outage in `stage` (`source`, `catalog`, `storage`,
/// `registry`, ...): not ready until [`recovered`]. Counts `floe_transient_retries_total`.
pub fn transient_failure(pipeline: &str, stage: &'static str, reason: &str) {
    super::metric::transient_retry(pipeline, stage);
    let now = Instant::now();
    with(|r| {
        let p = r.entry(pipeline);
        let since = p.retrying.as_ref().map_or(now, |t| t.since);
        p.retrying = Some(Retrying {
            stage,
            reason: reason.to_string(),
            since,
        });
    });
}

/// The step that was being retried succeeded.
pub fn recovered(pipeline: &str) {
    with(|r| r.entry(pipeline).retrying = None);
}

/// The pipeline stopped: `error` is why, `None` for a requested shutdown. It holds no
/// partitions any more (its consumer left the group).
pub fn pipeline_stopped(pipeline: &str, error: Option<&str>) {
    super::metric::partitions(pipeline, 0);
    with(|r| {
        let p = r.entry(pipeline);
        p.partitions = 0;
        p.stopped = Some(error.map(str::to_string));
    });
}

/// Forgets every pipeline (a new `run` starts).
pub fn reset() {
    with(|r| r.pipelines.clear());
}

/// The current answer of `/readyz`.
pub fn readiness(commit_intervals: u32) -> Readiness {
    with(|r| r.readiness(Instant::now(), commit_intervals))
}

#[derive(Debug, Clone)]
struct Retrying {
    stage: &'static str,
    reason: String,
    since: Instant,
}

#[derive(Debug, Clone)]
struct PipelineHealth {
    started: Instant,
    commit_interval: Duration,
    partitions: usize,
    /// Last commit per table.
    tables: BTreeMap<String, Instant>,
    last_round: Option<Instant>,
    retrying: Option<Retrying>,
    /// `Some(None)`: stopped on request; `Some(Some(e))`: failed.
    stopped: Option<Option<String>>,
}

impl PipelineHealth {
    fn new(now: Instant, commit_interval: Duration) -> PipelineHealth {
        PipelineHealth {
            started: now,
            commit_interval,
            partitions: 0,
            tables: BTreeMap::new(),
            last_round: None,
            retrying: None,
            stopped: None,
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    pipelines: BTreeMap<String, PipelineHealth>,
}

impl Registry {
    fn started(&mut self, pipeline: &str, commit_interval: Duration, now: Instant) {
        self.pipelines.insert(
            pipeline.to_string(),
            PipelineHealth::new(now, commit_interval),
        );
    }

    /// The pipeline's entry; one not started yet is registered with the default interval.
    fn entry(&mut self, pipeline: &str) -> &mut PipelineHealth {
        self.pipelines
            .entry(pipeline.to_string())
            .or_insert_with(|| PipelineHealth::new(Instant::now(), Duration::from_secs(60)))
    }

    fn readiness(&self, now: Instant, commit_intervals: u32) -> Readiness {
        let mut pipelines = Vec::new();
        for (name, p) in &self.pipelines {
            let limit = p.commit_interval * commit_intervals.max(1);
            let mut problems = Vec::new();
            match &p.stopped {
                Some(None) => problems.push("stopped".to_string()),
                Some(Some(e)) => problems.push(format!("stopped: {e}")),
                None => {}
            }
            if let Some(r) = &p.retrying {
                problems.push(format!(
                    "retrying a transient failure in {} for {}s: {}",
                    r.stage,
                    now.saturating_duration_since(r.since).as_secs(),
                    r.reason
                ));
            }
            if p.stopped.is_none() && p.partitions == 0 {
                problems.push("no partitions assigned".to_string());
            }
            let base = p.last_round.map_or(p.started, |r| r.max(p.started));
            let ages: Vec<(Option<&str>, Duration)> = if p.tables.is_empty() {
                vec![(None, now.saturating_duration_since(base))]
            } else {
                p.tables
                    .iter()
                    .map(|(t, &c)| (Some(t.as_str()), now.saturating_duration_since(c.max(base))))
                    .collect()
            };
            if p.stopped.is_none() {
                for (table, age) in &ages {
                    if *age > limit {
                        problems.push(format!(
                            "{} not up to date for {}s (limit {}s: {} commit intervals of {}s)",
                            table.map_or("tables".to_string(), |t| format!("table {t}")),
                            age.as_secs(),
                            limit.as_secs(),
                            commit_intervals,
                            p.commit_interval.as_secs()
                        ));
                    }
                }
            }
            let newest = ages.iter().map(|(_, a)| *a).min().unwrap_or_default();
            pipelines.push(PipelineReadiness {
                pipeline: name.clone(),
                partitions: p.partitions,
                since_up_to_date: newest,
                problems,
            });
        }
        Readiness { pipelines }
    }
}

/// Readiness of every pipeline.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// One entry per pipeline, by name.
    pub pipelines: Vec<PipelineReadiness>,
}

impl Readiness {
    /// Whether `/readyz` answers 200: some pipeline started and none has a problem.
    pub fn is_ready(&self) -> bool {
        !self.pipelines.is_empty() && self.pipelines.iter().all(|p| p.problems.is_empty())
    }
}

/// One pipeline's readiness.
#[derive(Debug, Clone)]
pub struct PipelineReadiness {
    /// Pipeline name.
    pub pipeline: String,
    /// Partitions assigned.
    pub partitions: usize,
    /// Time since its tables were last brought up to date (the freshest table).
    pub since_up_to_date: Duration,
    /// Why it is not ready (empty when ready).
    pub problems: Vec<String>,
}

impl fmt::Display for Readiness {
    /// `ready` or `not ready`, then one line per pipeline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}",
            if self.is_ready() {
                "ready"
            } else {
                "not ready"
            }
        )?;
        if self.pipelines.is_empty() {
            writeln!(f, "no pipeline started yet")?;
        }
        for p in &self.pipelines {
            if p.problems.is_empty() {
                writeln!(
                    f,
                    "{}: ok ({} partitions, up to date {}s ago)",
                    p.pipeline,
                    p.partitions,
                    p.since_up_to_date.as_secs()
                )?;
            } else {
                writeln!(f, "{}: {}", p.pipeline, p.problems.join("; "))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn ready(r: &Registry, now: Instant) -> (bool, String) {
        let readiness = r.readiness(now, 3);
        (readiness.is_ready(), readiness.to_string())
    }

    #[test]
    fn not_ready_before_a_pipeline_starts_or_gets_partitions() {
        let t0 = Instant::now();
        let mut r = Registry::default();
        assert_eq!(
            ready(&r, t0),
            (false, "not ready\nno pipeline started yet\n".into())
        );
        r.started("events", MIN, t0);
        let (ok, text) = ready(&r, t0);
        assert!(!ok);
        assert!(text.contains("events: no partitions assigned"), "{text}");
        r.entry("events").partitions = 4;
        assert_eq!(
            ready(&r, t0 + Duration::from_secs(5)),
            (
                true,
                "ready\nevents: ok (4 partitions, up to date 5s ago)\n".into()
            )
        );
    }

    #[test]
    fn stale_table_makes_it_unready_until_a_commit_or_an_empty_round() {
        let t0 = Instant::now();
        let mut r = Registry::default();
        r.started("events", MIN, t0);
        r.entry("events").partitions = 1;
        r.entry("events")
            .tables
            .insert("demo.events".into(), t0 + MIN);
        r.entry("events").tables.insert("demo.eu".into(), t0 + MIN);
        // 3 intervals after the last commit: still ready; past that: not.
        assert!(ready(&r, t0 + 4 * MIN).0);
        let (ok, text) = ready(&r, t0 + 4 * MIN + Duration::from_secs(1));
        assert!(!ok);
        assert!(
            text.contains(
                "table demo.eu not up to date for 181s (limit 180s: 3 commit intervals of 60s)"
            ),
            "{text}"
        );
        // One table committed again: the other still stale.
        r.entry("events")
            .tables
            .insert("demo.events".into(), t0 + 4 * MIN);
        let (ok, text) = ready(&r, t0 + 4 * MIN + Duration::from_secs(1));
        assert!(
            !ok && text.contains("demo.eu") && !text.contains("demo.events not"),
            "{text}"
        );
        // A round with nothing to commit brings every table up to date.
        r.entry("events").last_round = Some(t0 + 4 * MIN);
        assert!(ready(&r, t0 + 4 * MIN + Duration::from_secs(1)).0);
    }

    #[test]
    fn retrying_and_stopped_are_not_ready() {
        let t0 = Instant::now();
        let mut r = Registry::default();
        r.started("a", MIN, t0);
        r.started("b", MIN, t0);
        r.entry("a").partitions = 2;
        r.entry("b").partitions = 2;
        assert!(ready(&r, t0).0);
        r.entry("a").retrying = Some(Retrying {
            stage: "catalog",
            reason: "connection refused".into(),
            since: t0,
        });
        let (ok, text) = ready(&r, t0 + Duration::from_secs(7));
        assert!(!ok);
        assert!(
            text.contains("a: retrying a transient failure in catalog for 7s: connection refused"),
            "{text}"
        );
        assert!(text.contains("b: ok"), "{text}");
        r.entry("a").retrying = None;
        r.entry("b").stopped = Some(Some("boom".into()));
        let (ok, text) = ready(&r, t0);
        assert!(!ok && text.contains("b: stopped: boom"), "{text}");
        r.entry("b").stopped = Some(None);
        assert!(ready(&r, t0).1.contains("b: stopped\n"));
    }

    #[test]
    fn global_calls_reach_the_registry() {
        // The global registry is shared by the tests of this binary: use unique names.
        pipeline_started("health-test", Duration::from_secs(1));
        partitions_assigned("health-test", 3);
        table_committed("health-test", "ns.t");
        transient_failure("health-test", "source", "broker down");
        let text = readiness(3).to_string();
        assert!(
            text.contains("health-test: retrying a transient failure in source"),
            "{text}"
        );
        recovered("health-test");
        flush_completed("health-test");
        let text = readiness(3).to_string();
        assert!(text.contains("health-test: ok (3 partitions"), "{text}");
        pipeline_stopped("health-test", None);
        assert!(readiness(3).to_string().contains("health-test: stopped"));
    }
}
