//! The committer task: seals in, Iceberg snapshots out, one seal at a time.
//!
//! Per seal, every table that receives rows exists first (a new one is created with
//! the offsets the seal starts from, so a crash between two tables' commits makes the
//! pipeline read again for the later ones); then each table's rows are written as
//! Parquet and committed with the offsets the seal covers. A transient failure is
//! retried with backoff on the same seal; a fenced commit rewinds the pipeline; anything
//! else stops it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use iceberg::spec::Schema;
use tokio::sync::{mpsc, watch};

use super::PipelineError;
use super::intake::{Handoff, Seal, SealedTable};
use crate::commit::OffsetMap;
use crate::config::PipelineConfig;
use crate::error::{Classify, ErrorClass, backoff};
use crate::record::PartitionMap;
use crate::sink::{SinkError, Staged, TableSink};
use crate::source::KnownOffsets;
use crate::{failpoint, telemetry};

/// A table with no new rows still records the pipeline's progress every this many
/// seals, so a restart does not re-read much for it.
const OFFSETS_ONLY_EVERY: u32 = 10;

/// What the committer tells the intake.
#[derive(Debug)]
pub(super) enum Report {
    /// Table `table` now stores `offsets`.
    Committed {
        /// Table index.
        table: usize,
        /// What it stores for the pipeline.
        offsets: OffsetMap,
    },
    /// Everything not committed is dropped: read again from the tables' offsets, with
    /// records of `epoch` and later.
    Rewind {
        /// The new read epoch.
        epoch: u64,
        /// Per table: what it stores now.
        tables: Vec<TableState>,
    },
    /// The pipeline cannot go on.
    Failed(PipelineError),
    /// The closing seal is committed.
    Done,
}

/// A table as loaded from the catalog.
#[derive(Debug)]
pub(super) struct TableState {
    /// Its stored offsets for the pipeline.
    pub committed: OffsetMap,
    /// Its current schema, if it exists.
    pub schema: Option<Arc<Schema>>,
    /// Whether it exists.
    pub exists: bool,
}

struct CommitTable {
    sink: TableSink,
    /// What the table stores for this pipeline (authoritative: read from commits).
    committed: OffsetMap,
    rounds_without_commit: u32,
}

pub(super) struct Committer {
    config: Arc<PipelineConfig>,
    tables: Vec<CommitTable>,
    known: Arc<KnownOffsets>,
    reports: Sender<Report>,
    epoch: u64,
    /// Turns true when the pipeline is asked to stop.
    shutdown: watch::Receiver<bool>,
    /// When the stop request (or the closing seal) was first seen: past
    /// [`SHUTDOWN_GRACE`] a failing step is not tried again, so a stop request always
    /// ends the pipeline.
    closing_since: Option<Instant>,
}

/// How long a stopping pipeline keeps retrying a failing commit of its last records
/// (they are read again at the next start if it gives up).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Why a seal did not commit.
enum SealError {
    /// Another writer moved our partitions' offsets: rewind.
    Fenced(String),
    /// Stop the pipeline.
    Fatal(PipelineError),
}

impl Committer {
    pub(super) fn new(
        config: Arc<PipelineConfig>,
        sinks: Vec<TableSink>,
        known: Arc<KnownOffsets>,
        reports: Sender<Report>,
        shutdown: watch::Receiver<bool>,
    ) -> Committer {
        let tables = sinks
            .into_iter()
            .map(|sink| CommitTable {
                committed: sink.stored_offsets().unwrap_or_default(),
                sink,
                rounds_without_commit: 0,
            })
            .collect();
        Committer {
            config,
            tables,
            known,
            reports,
            epoch: 0,
            shutdown,
            closing_since: None,
        }
    }

    /// Whether a stop was requested long enough ago that failing steps are given up.
    fn past_shutdown_grace(&mut self) -> bool {
        if self.closing_since.is_none() && *self.shutdown.borrow() {
            self.closing_since = Some(Instant::now());
        }
        self.closing_since
            .is_some_and(|t| t.elapsed() >= SHUTDOWN_GRACE)
    }

    fn name(&self) -> &str {
        &self.config.name
    }

    pub(super) async fn run(
        mut self,
        mut seals: mpsc::Receiver<Handoff>,
    ) -> Result<(), PipelineError> {
        while let Some(handoff) = seals.recv().await {
            match handoff {
                Handoff::Rewind { epoch, reason } => {
                    if epoch < self.epoch {
                        continue;
                    }
                    tracing::warn!(pipeline = %self.name(), %reason, "rewinding to the offsets stored in the table(s)");
                    if let Err(e) = self.rewind().await {
                        let _ = self.reports.send(Report::Failed(e));
                        return Ok(());
                    }
                }
                Handoff::Seal(seal) => {
                    if seal.epoch < self.epoch {
                        // Cut before a rewind: its records will be read again. A closing
                        // one still ends the pipeline (as a fenced closing seal does).
                        if seal.closing {
                            let _ = self.reports.send(Report::Done);
                            return Ok(());
                        }
                        continue;
                    }
                    let closing = seal.closing;
                    match self.commit_seal(seal).await {
                        Ok(()) => {}
                        Err(SealError::Fenced(reason)) => {
                            telemetry::fenced(self.name());
                            tracing::warn!(pipeline = %self.name(), %reason, "commit fenced: reloading offsets from the tables and re-reading");
                            if let Err(e) = self.rewind().await {
                                let _ = self.reports.send(Report::Failed(e));
                                return Ok(());
                            }
                            if closing {
                                // Stopping: what was not committed is read again next time.
                                let _ = self.reports.send(Report::Done);
                                return Ok(());
                            }
                            continue;
                        }
                        Err(SealError::Fatal(e)) => {
                            let _ = self.reports.send(Report::Failed(e));
                            return Ok(());
                        }
                    }
                    if closing {
                        let _ = self.reports.send(Report::Done);
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// Reloads every table and tells the intake to read again from what they store.
    async fn rewind(&mut self) -> Result<(), PipelineError> {
        let mut states = Vec::with_capacity(self.tables.len());
        for i in 0..self.tables.len() {
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self.reload(i).await {
                    Ok(()) => break,
                    Err(e) if e.class() == ErrorClass::Transient && attempt < MAX_STEP_ATTEMPTS => {
                        let wait =
                            backoff(attempt, Duration::from_millis(250), Duration::from_secs(30));
                        telemetry::transient_retry(self.name(), "reload");
                        tracing::warn!(pipeline = %self.name(), attempt, error = %e, "transient failure reloading a table: retrying");
                        tokio::time::sleep(wait).await;
                    }
                    Err(e) => return Err(PipelineError::sink(self.name())(e)),
                }
            }
            let t = &self.tables[i];
            states.push(TableState {
                committed: t.committed.clone(),
                schema: t.sink.current_schema(),
                exists: t.sink.exists(),
            });
        }
        self.remember();
        self.epoch += 1;
        let _ = self.reports.send(Report::Rewind {
            epoch: self.epoch,
            tables: states,
        });
        Ok(())
    }

    async fn reload(&mut self, i: usize) -> Result<(), SinkError> {
        let t = &mut self.tables[i];
        t.sink.reload().await?;
        t.committed = t.sink.stored_offsets()?;
        Ok(())
    }

    /// Updates the offsets the position lookup falls back on.
    fn remember(&self) {
        let mut known = self.known.lock().expect("known offsets");
        known.clear();
        for (i, t) in self.tables.iter().enumerate() {
            for (tp, o) in &t.committed.0 {
                let entry = known
                    .entry(tp.clone())
                    .or_insert_with(|| vec![None; self.tables.len()]);
                entry[i] = Some(*o);
            }
        }
    }

    async fn commit_seal(&mut self, seal: Seal) -> Result<(), SealError> {
        let started = Instant::now();
        if seal.closing {
            self.closing_since.get_or_insert(started);
        }
        let has_rows: Vec<bool> = seal.tables.iter().map(|t| t.buffered.rows > 0).collect();
        if has_rows.iter().any(|r| *r) {
            failpoint::hit(failpoint::BEFORE_WRITE);
        }
        // Schemas first: every table that receives rows exists (a new one starting at
        // the seal's start) before any table commits.
        for (i, sealed) in seal.tables.iter().enumerate() {
            if !has_rows[i] {
                continue;
            }
            let from = OffsetMap(seal.from.clone());
            self.step(
                i,
                Step::Schema {
                    sealed,
                    from: &from,
                },
            )
            .await?;
        }
        let extra = offset_anomalies(&seal.gaps, &seal.resets);
        for (i, sealed) in seal.tables.iter().enumerate() {
            let t = &mut self.tables[i];
            let mut target = t.committed.clone();
            for (tp, o) in &seal.next {
                let c = target.0.entry(tp.clone()).or_insert(*o);
                // Stored offsets never go back.
                *c = (*c).max(*o);
            }
            if target == t.committed && !has_rows[i] && extra.is_empty() {
                continue;
            }
            // A partition the table has no offsets for yet is recorded at once (its
            // start position must survive a restart: `start = "latest"` applies once).
            let new_partition = seal.next.keys().any(|tp| !t.committed.0.contains_key(tp));
            if !has_rows[i] {
                if !seal.closing
                    && !new_partition
                    && extra.is_empty()
                    && t.rounds_without_commit + 1 < OFFSETS_ONLY_EVERY
                {
                    t.rounds_without_commit += 1;
                    continue;
                }
                if !t.sink.exists() {
                    continue;
                }
            }
            let outcome = self
                .step(
                    i,
                    Step::Commit {
                        sealed,
                        covers: &seal.next,
                        target: &target,
                        gaps: &extra,
                    },
                )
                .await?
                .ok_or_else(|| {
                    SealError::Fatal(PipelineError::internal(
                        &self.config.name,
                        "commit without outcome",
                    ))
                })?;
            let t = &mut self.tables[i];
            tracing::info!(pipeline = %self.config.name, table = %t.sink.ident(), snapshot_id = outcome.snapshot_id, files = outcome.files, delete_files = outcome.delete_files, rows = sealed.buffered.rows, ms = started.elapsed().as_millis() as u64, "committed");
            telemetry::records_out(&self.config.name, sealed.buffered.rows as u64);
            telemetry::committed(&self.config.name, outcome.files);
            telemetry::bytes_committed(&self.config.name, outcome.bytes);
            telemetry::commit_duration(&self.config.name, started.elapsed());
            telemetry::health::table_committed(&self.config.name, &t.sink.ident().to_string());
            t.committed = target.clone();
            t.rounds_without_commit = 0;
            let _ = self.reports.send(Report::Committed {
                table: i,
                offsets: target,
            });
            failpoint::hit(failpoint::AFTER_COMMIT);
        }
        self.remember();
        telemetry::health::flush_completed(&self.config.name);
        Ok(())
    }

    /// Creates the table if it does not exist yet.
    async fn ensure_table(
        &mut self,
        i: usize,
        sealed: &SealedTable,
        from: &OffsetMap,
    ) -> Result<(), SinkError> {
        let t = &mut self.tables[i];
        if t.sink.ensure_table(&sealed.tracker, from).await? {
            // A table created just now stores `from`. (A table someone else created
            // meanwhile keeps what we expect of it: the fence checks that.)
            t.committed = t.sink.stored_offsets()?;
        }
        Ok(())
    }

    async fn write_and_commit(
        &mut self,
        i: usize,
        sealed: &SealedTable,
        covers: &PartitionMap<i64>,
        target: &OffsetMap,
        gaps: &HashMap<String, String>,
    ) -> Result<crate::sink::CommitOutcome, SinkError> {
        let t = &mut self.tables[i];
        // Records the table holds already were read again (a partition revoked and
        // assigned back while a commit of it was in flight read the table's offsets
        // before that commit landed): committing them would duplicate them.
        if let Some((tp, first, stored)) =
            sealed
                .buffered
                .first_offsets
                .iter()
                .find_map(|(tp, first)| {
                    t.committed
                        .0
                        .get(tp)
                        .filter(|stored| first < *stored)
                        .map(|stored| (tp, *first, *stored))
                })
        {
            return Err(SinkError::Fenced(format!(
                "{}/{}: records from offset {first} were read again, the table holds up to {stored}",
                tp.0, tp.1
            )));
        }
        let files = if sealed.buffered.rows > 0 {
            // A fresh view: the schema is derived from the table as it is now, and no
            // file of an old view (expired by another writer since) is read.
            t.sink.reload().await?;
            let files = t.sink.write(&sealed.buffered, &sealed.tracker).await?;
            failpoint::hit(failpoint::AFTER_WRITE);
            files
        } else {
            Staged::empty()
        };
        // The fence covers the partitions of this seal only: other agents' partitions
        // are carried forward as found.
        let expected: PartitionMap<Option<i64>> = covers
            .keys()
            .map(|tp| (tp.clone(), t.committed.0.get(tp).copied()))
            .collect();
        t.sink.commit(files, &expected, target, gaps.clone()).await
    }

    /// Runs one step of a seal, retrying transient failures with backoff; a fence ends
    /// the seal for a rewind.
    async fn step(
        &mut self,
        table: usize,
        step: Step<'_>,
    ) -> Result<Option<crate::sink::CommitOutcome>, SealError> {
        let what = match step {
            Step::Schema { .. } => "schema",
            Step::Commit { .. } => "commit",
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match &step {
                Step::Schema { sealed, from } => {
                    self.ensure_table(table, sealed, from).await.map(|()| None)
                }
                Step::Commit {
                    sealed,
                    covers,
                    target,
                    gaps,
                } => self
                    .write_and_commit(table, sealed, covers, target, gaps)
                    .await
                    .map(Some),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(SinkError::Fenced(reason)) => return Err(SealError::Fenced(reason)),
                Err(e) if e.class() == ErrorClass::Transient && self.past_shutdown_grace() => {
                    tracing::error!(pipeline = %self.name(), table = %self.tables[table].sink.ident(), error = %e, "stopping: gave up committing the last records (they are read again at the next start)");
                    return Err(SealError::Fatal(PipelineError::sink(self.name())(e)));
                }
                Err(e) if e.class() == ErrorClass::Transient && attempt < MAX_STEP_ATTEMPTS => {
                    let wait =
                        backoff(attempt, Duration::from_millis(250), Duration::from_secs(30));
                    telemetry::transient_retry(self.name(), what);
                    tracing::warn!(pipeline = %self.name(), table = %self.tables[table].sink.ident(), step = what, attempt, error = %e, retry_in_ms = wait.as_millis() as u64, "transient failure: retrying");
                    // A stop request cuts the wait short (the grace period is checked next).
                    let mut shutdown = self.shutdown.clone();
                    let stop = async move {
                        let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
                    };
                    let stopping = tokio::select! {
                        _ = tokio::time::sleep(wait) => false,
                        _ = stop => true,
                    };
                    if stopping {
                        tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
                    }
                    // The table may have moved on while it failed.
                    if let Err(reload) = self.tables[table].sink.reload().await {
                        tracing::warn!(pipeline = %self.name(), error = %reload, "reload after a failure failed too");
                    }
                }
                Err(e) => return Err(SealError::Fatal(PipelineError::sink(self.name())(e))),
            }
        }
    }
}

/// One retryable step of a seal for one table.
enum Step<'a> {
    /// Create the table if it does not exist.
    Schema {
        sealed: &'a SealedTable,
        from: &'a OffsetMap,
    },
    /// Write the rows and commit them with the offsets.
    Commit {
        sealed: &'a SealedTable,
        covers: &'a PartitionMap<i64>,
        target: &'a OffsetMap,
        gaps: &'a HashMap<String, String>,
    },
}

/// Attempts of one step before a transient failure is given up on (about an hour with
/// the 30 s cap).
const MAX_STEP_ATTEMPTS: u32 = 120;

/// Summary properties recording what reading found, each as
/// `{"topic": {"partition": [stored offset, first offset read]}}`: records lost to
/// retention before they were read (`floe.offset-gaps`), and partitions whose log
/// restarted below the stored offset (`floe.offset-resets`: a recreated topic, an
/// unclean leader election), whose records below the stored offset were skipped.
fn offset_anomalies(
    gaps: &PartitionMap<(i64, i64)>,
    resets: &PartitionMap<(i64, i64)>,
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (key, found) in [
        (crate::commit::GAP_KEY, gaps),
        (crate::commit::RESET_KEY, resets),
    ] {
        if found.is_empty() {
            continue;
        }
        let mut sorted: std::collections::BTreeMap<
            &str,
            std::collections::BTreeMap<String, [i64; 2]>,
        > = Default::default();
        for ((topic, partition), (expected, first)) in found {
            sorted
                .entry(topic)
                .or_default()
                .insert(partition.to_string(), [*expected, *first]);
        }
        if let Ok(json) = serde_json::to_string(&sorted) {
            out.insert(key.to_string(), json);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use tokio::sync::{Semaphore, mpsc};

    use super::super::intake::{Handoff, Seal};
    use super::*;

    const CONFIG: &str = r#"
[catalogs.local]
type = "embedded"
path = "catalog.db"
warehouse = "warehouse"

[[pipelines]]
name = "p"
[pipelines.source]
bootstrap_servers = "127.0.0.1:9"
group_id = "g"
topics = ["t"]
[pipelines.sink]
catalog = "local"
namespace = "ns"
table = "t"
"#;

    /// A fence rewinds the committer to a new epoch while the intake, not told yet,
    /// sends its closing seal in the old one: the seal's rows are read again next time,
    /// and the intake must still hear that closing is done (it waited forever, and
    /// SIGTERM never ended the agent).
    #[tokio::test]
    async fn a_closing_seal_from_before_a_rewind_still_ends_the_pipeline() {
        let config = crate::config::Config::parse(CONFIG, &|_| None).unwrap();
        let (reports, heard) = crossbeam_channel::unbounded();
        let (_stop, shutdown) = watch::channel(false);
        let mut committer = Committer::new(
            Arc::new(config.pipelines[0].clone()),
            Vec::new(),
            Arc::default(),
            reports,
            shutdown,
        );
        committer.epoch = 1;
        let (seals, inbox) = mpsc::channel(1);
        let permit = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        seals
            .send(Handoff::Seal(Seal {
                epoch: 0,
                closing: true,
                tables: Vec::new(),
                next: Default::default(),
                from: Default::default(),
                gaps: Default::default(),
                resets: Default::default(),
                _in_flight: permit,
            }))
            .await
            .unwrap();
        let run = tokio::spawn(committer.run(inbox));
        let report = tokio::task::spawn_blocking(move || {
            heard.recv_timeout(std::time::Duration::from_secs(10))
        })
        .await
        .unwrap();
        assert!(
            matches!(report, Ok(Report::Done)),
            "the intake hears: {report:?}"
        );
        drop(seals);
        run.await.unwrap().unwrap();
    }
}
