//! The committer task: chunks of rows in, data files and Iceberg snapshots out.
//!
//! A [`Chunk`] is streamed into the open data files of its table at once (a table that
//! does not exist yet is created first, with the offsets its interval starts from). A
//! [`Mark`] ends a commit interval: every table's open files are closed and committed,
//! each table in one snapshot with the offsets the mark names.
//!
//! A commit that fails for a transient reason (the catalog unreachable, say) is tried
//! again with backoff while chunks keep streaming into new files: the next attempt
//! commits everything written since the last commit as one snapshot. Past
//! `max_uncommitted_bytes` no more chunks are taken (the intake, then the source, wait)
//! until a commit lands. A fenced commit, a write that failed (its open files may be
//! broken) or a schema another writer changed rewinds the pipeline: everything not
//! committed is dropped and read again from the offsets the tables store. Anything else
//! stops it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::PipelineError;
use super::handoff::{Chunk, Handoff, Mark, Report, TableState};
use super::tables::TableMap;
use crate::config::PipelineConfig;
use crate::error::{Classify, ErrorClass, retry};
use crate::record::PartitionMap;
use crate::sink::{COMMIT_ATTEMPT_TIMEOUT, COMMIT_GIVE_UP, CommitOutcome, SinkError, TableSink};
use crate::source::KnownOffsets;
use crate::{failpoint, telemetry};
use floe_iceberg::OffsetMap;

/// A table with no new rows still records the pipeline's progress every this many
/// intervals, so a restart does not re-read much for it.
const OFFSETS_ONLY_EVERY: u32 = 10;

/// A step that fails transiently (creating or reloading a table, a commit) is tried 120
/// times, about an hour with the 30 s cap, before it is given up on.
const STEP_RETRY: retry::Policy =
    retry::Policy::backoff(Duration::from_millis(250), Duration::from_secs(30)).attempts(120);

/// Failed writes rewind and read the records again, waiting longer while writes keep
/// failing (storage down), for as long as it takes.
const WRITE_RETRY: retry::Policy =
    retry::Policy::backoff(Duration::from_millis(250), Duration::from_secs(30));

/// Commits to different tables in flight at once (each is its own compare-and-swap; a
/// table per topic can mean hundreds of commits per interval).
const CONCURRENT_COMMITS: usize = 8;

/// How long a stopping pipeline keeps retrying a failing commit of its last records
/// (they are read again at the next start if it gives up).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

struct CommitTable {
    sink: TableSink,
    /// What the table stores for this pipeline (authoritative: read from commits).
    committed: OffsetMap,
    /// The offsets the next commit moves this pipeline's partitions to (the latest
    /// mark's, for every partition read since the last commit), if not committed yet.
    target: Option<OffsetMap>,
    /// Summary properties the next commit records (offset gaps and resets).
    extra: HashMap<String, String>,
    /// Rows and bytes (as read: values and keys) in the generation being written.
    writing: Volume,
    /// Rows and bytes in the generations cut and not committed yet: what a commit
    /// reports as `floe_records_out_total`; with `writing`, what
    /// `max_uncommitted_bytes` bounds.
    cut: Volume,
    /// Marks since the last commit of this table.
    rounds_without_commit: u32,
    /// Per partition, the highest offset handed to this table in this read epoch
    /// (written to its files, committed or not): records at or below it that arrive again
    /// were read twice.
    written_through: PartitionMap<i64>,
}

impl CommitTable {
    /// Why `chunk` holds records this table has already: committed ones (a partition
    /// revoked and assigned back while a commit of it was in flight read the table's
    /// offsets before that commit landed), or ones in its uncommitted files (assigned back
    /// while a failed commit waited for its retry: the table's offsets had not moved).
    /// Writing them would duplicate them; the caller rewinds instead.
    fn read_again(&self, chunk: &Chunk) -> Option<String> {
        for (tp, (first, _)) in &chunk.buffered.offsets {
            if let Some(stored) = self.committed.0.get(tp).filter(|s| first < *s) {
                return Some(format!(
                    "{}/{}: records from offset {first} were read again, the table holds up to {stored}",
                    tp.0, tp.1
                ));
            }
            if let Some(through) = self.written_through.get(tp).filter(|w| first <= *w) {
                return Some(format!(
                    "{}/{}: records from offset {first} were read again, uncommitted files hold up to {through}",
                    tp.0, tp.1
                ));
            }
        }
        None
    }

    fn new(sink: TableSink) -> CommitTable {
        CommitTable {
            committed: sink.stored_offsets().unwrap_or_default(),
            sink,
            target: None,
            extra: HashMap::new(),
            writing: Volume::default(),
            cut: Volume::default(),
            rounds_without_commit: 0,
            written_through: PartitionMap::default(),
        }
    }
}

/// One table's commit: what it expects the table to store and what it stores after.
struct CommitJob {
    table: usize,
    expected: PartitionMap<Option<i64>>,
    target: OffsetMap,
    extra: HashMap<String, String>,
}

/// Rows and bytes handed over.
#[derive(Default, Clone, Copy)]
struct Volume {
    rows: u64,
    bytes: u64,
}

pub(super) struct Committer {
    config: Arc<PipelineConfig>,
    tables: Vec<CommitTable>,
    /// Which partitions' offsets each table stores.
    map: Arc<TableMap>,
    known: Arc<KnownOffsets>,
    reports: Sender<Report>,
    epoch: u64,
    /// Bytes written and not committed, for the intake's early mark.
    uncommitted: Arc<AtomicU64>,
    /// A failed commit is tried again at this time (chunks keep streaming meanwhile).
    retry_at: Option<tokio::time::Instant>,
    /// Failed commit attempts in a row.
    attempts: retry::Attempts,
    /// When the commits failing now first failed: past [`COMMIT_GIVE_UP`] the pipeline
    /// stops (orphan cleanup relies on that bound, see `sink::min_orphan_age`).
    failing_since: Option<Instant>,
    /// Rewinds after failed writes in a row.
    failed_writes: retry::Attempts,
    /// The closing mark has arrived: once its commit lands (or is given up), stop.
    closing: bool,
    /// The newest mark taken (committed once every table is).
    last_seq: Option<u64>,
    /// Turns true when the pipeline is asked to stop.
    shutdown: watch::Receiver<bool>,
    /// When the stop request (or the closing mark) was first seen: past
    /// [`SHUTDOWN_GRACE`] a failing commit is not tried again, so a stop request always
    /// ends the pipeline.
    closing_since: Option<Instant>,
}

/// Why a step did not succeed.
enum Halt {
    /// Drop what is not committed and read again from the tables' offsets.
    Rewind(String),
    /// Stop the pipeline.
    Fatal(PipelineError),
}

impl Committer {
    pub(super) fn new(
        config: Arc<PipelineConfig>,
        sinks: Vec<TableSink>,
        map: Arc<TableMap>,
        known: Arc<KnownOffsets>,
        reports: Sender<Report>,
        uncommitted: Arc<AtomicU64>,
        shutdown: watch::Receiver<bool>,
    ) -> Committer {
        let tables = sinks.into_iter().map(CommitTable::new).collect();
        Committer {
            config,
            tables,
            map,
            known,
            reports,
            epoch: 0,
            uncommitted,
            retry_at: None,
            attempts: STEP_RETRY.start(),
            failing_since: None,
            failed_writes: WRITE_RETRY.start(),
            closing: false,
            last_seq: None,
            shutdown,
            closing_since: None,
        }
    }

    fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether no more chunks may be taken until a commit lands.
    fn full(&self) -> bool {
        self.retry_at.is_some()
            && self.uncommitted.load(Ordering::Relaxed) >= self.config.sink.max_uncommitted_bytes
    }

    pub(super) async fn run(
        mut self,
        mut inbox: mpsc::Receiver<Handoff>,
    ) -> Result<(), PipelineError> {
        loop {
            let retry_at = self.retry_at;
            let take = !self.full() && !self.closing;
            let step = tokio::select! {
                handoff = inbox.recv(), if take => match handoff {
                    Some(h) => self.on_handoff(h).await,
                    None => return Ok(()),
                },
                _ = sleep_until(retry_at), if retry_at.is_some() => {
                    self.retry_at = None;
                    self.commit_all().await
                }
            };
            if let Err(halt) = step {
                match halt {
                    Halt::Rewind(reason) => {
                        if let Err(e) = self.rewind(&reason).await {
                            let _ = self.reports.send(Report::Failed(e));
                            return Ok(());
                        }
                        if self.closing {
                            // Stopping: what was not committed is read again next time.
                            self.done().await;
                            return Ok(());
                        }
                    }
                    Halt::Fatal(e) => {
                        let _ = self.reports.send(Report::Failed(e));
                        return Ok(());
                    }
                }
            }
            if self.closing && self.retry_at.is_none() {
                self.done().await;
                return Ok(());
            }
        }
    }

    /// Keeps what outlives the run (upsert indexes, on disk) and says the pipeline is
    /// done.
    async fn done(&mut self) {
        for t in &mut self.tables {
            if let Err(e) = t.sink.close().await {
                tracing::warn!(pipeline = %self.config.name, table = %t.sink.ident(), error = %e, "the upsert index could not be kept on disk: the next start rebuilds it");
            }
        }
        let _ = self.reports.send(Report::Done);
    }

    async fn on_handoff(&mut self, handoff: Handoff) -> Result<(), Halt> {
        match handoff {
            Handoff::Rows(chunk) => {
                if chunk.epoch < self.epoch {
                    // Read before a rewind: it will be read again.
                    return Ok(());
                }
                self.write(*chunk).await
            }
            Handoff::Mark(mark) => {
                if mark.epoch < self.epoch {
                    // Cut before a rewind: its records will be read again. A closing one
                    // still ends the pipeline (as a fenced closing commit does).
                    if mark.closing {
                        self.closing = true;
                    }
                    return Ok(());
                }
                self.on_mark(mark).await
            }
            Handoff::AddTable(sink) => {
                // Whatever the epoch: table indexes never change.
                self.tables.push(CommitTable::new(*sink));
                Ok(())
            }
            Handoff::Rewind { epoch, reason } => {
                if epoch < self.epoch {
                    return Ok(());
                }
                Err(Halt::Rewind(reason))
            }
        }
    }

    /// Streams a chunk into its table's open files (creating the table first if needed).
    async fn write(&mut self, chunk: Chunk) -> Result<(), Halt> {
        let i = chunk.table;
        if let Some(reason) = self.tables[i].read_again(&chunk) {
            return Err(Halt::Rewind(reason));
        }
        let t = &mut self.tables[i];
        for (tp, (_, last)) in &chunk.buffered.offsets {
            let through = t.written_through.entry(tp.clone()).or_insert(*last);
            *through = (*through).max(*last);
        }
        if chunk.buffered.rows == 0 {
            return Ok(());
        }
        failpoint::hit(failpoint::BEFORE_WRITE);
        if !self.tables[i].sink.exists() {
            let mut from = OffsetMap(chunk.from.clone().unwrap_or_default());
            from.0.retain(|tp, _| self.map.covering(tp).contains(&i));
            let mut attempts = STEP_RETRY.start();
            loop {
                let e = match self.tables[i]
                    .sink
                    .ensure_table(&chunk.tracker, &from)
                    .await
                {
                    Ok(_) => break,
                    Err(e) => e,
                };
                match e {
                    SinkError::Fenced(reason) => return Err(Halt::Rewind(reason)),
                    e => {
                        let wait = attempts.retry_after(e.class());
                        let Some(wait) = wait.filter(|_| !self.past_shutdown_grace()) else {
                            return Err(self.fatal(e));
                        };
                        telemetry::transient_retry(self.name(), "create table");
                        tracing::warn!(pipeline = %self.name(), attempt = attempts.failures(), error = %e, retry_in_ms = wait.as_millis() as u64, "creating the table failed: retrying");
                        self.pause(wait).await;
                    }
                }
            }
            // A table created just now stores `from`. (A table someone else created
            // meanwhile keeps what we expect of it: the fence checks that.)
            let stored = self.tables[i].sink.stored_offsets();
            self.tables[i].committed = stored.map_err(|e| self.fatal(e))?;
        }
        let t = &mut self.tables[i];
        match t.sink.write_rows(&chunk.buffered, &chunk.tracker).await {
            Ok(()) => {}
            Err(SinkError::Fenced(reason)) => return Err(Halt::Rewind(reason)),
            Err(e) if e.class() == ErrorClass::Transient => {
                // The generation's open files are gone: read its records again, after a
                // wait that grows while writes keep failing (storage down).
                let wait = self
                    .failed_writes
                    .retry_after(e.class())
                    .unwrap_or_default();
                telemetry::transient_retry(self.name(), "write");
                tracing::warn!(pipeline = %self.name(), table = %self.tables[i].sink.ident(), error = %e, retry_in_ms = wait.as_millis() as u64, "writing data files failed: reading the uncommitted records again");
                self.pause(wait).await;
                return Err(Halt::Rewind(format!("a data file write failed: {e}")));
            }
            Err(e) => return Err(self.fatal(e)),
        }
        let t = &mut self.tables[i];
        t.writing.rows += chunk.buffered.rows as u64;
        t.writing.bytes += chunk.buffered.bytes;
        let early = t.sink.take_closed_early();
        if early > 0 {
            telemetry::files_closed_early(&self.config.name, early);
        }
        failpoint::hit(failpoint::AFTER_WRITE);
        self.update_uncommitted();
        Ok(())
    }

    /// Publishes the bytes read and not committed yet (the intake marks early past the
    /// bound). An upsert table holds the keys written since its last commit in memory:
    /// once they take more than `index_memory`, the bound counts as reached too.
    fn update_uncommitted(&self) {
        let bytes: u64 = self
            .tables
            .iter()
            .map(|t| t.writing.bytes + t.cut.bytes)
            .sum();
        let keys_full = self
            .tables
            .iter()
            .any(|t| t.sink.overlay_memory() as u64 >= self.config.sink.index_memory);
        let bytes = match keys_full {
            true => bytes.max(self.config.sink.max_uncommitted_bytes),
            false => bytes,
        };
        self.uncommitted.store(bytes, Ordering::Relaxed);
        let rows = self
            .tables
            .iter()
            .map(|t| t.writing.rows + t.cut.rows)
            .sum();
        telemetry::uncommitted_rows(self.name(), rows);
    }

    /// The end of an interval: closes every table's open files and commits them.
    async fn on_mark(&mut self, mark: Mark) -> Result<(), Halt> {
        self.last_seq = Some(mark.seq);
        if mark.closing {
            self.closing = true;
            self.closing_since.get_or_insert_with(Instant::now);
        }
        // Each table's share of the mark: every partition, or its topic's.
        let n = self.tables.len();
        let mut next = vec![PartitionMap::default(); n];
        let mut gaps = vec![PartitionMap::default(); n];
        let mut resets = vec![PartitionMap::default(); n];
        for (tp, o) in &mark.next {
            for i in self.map.covering(tp).filter(|&i| i < n) {
                next[i].insert(tp.clone(), *o);
                if let Some(g) = mark.gaps.get(tp) {
                    gaps[i].insert(tp.clone(), *g);
                }
                if let Some(r) = mark.resets.get(tp) {
                    resets[i].insert(tp.clone(), *r);
                }
            }
        }
        for i in 0..n {
            let t = &mut self.tables[i];
            if let Err(e) = t.sink.cut().await {
                return Err(if e.class() == ErrorClass::Transient {
                    Halt::Rewind(format!("closing data files failed: {e}"))
                } else {
                    self.fatal(e)
                });
            }
            let t = &mut self.tables[i];
            t.cut.rows += t.writing.rows;
            t.cut.bytes += t.writing.bytes;
            t.writing = Volume::default();
            let mut target = t.target.take().unwrap_or_default();
            for (tp, o) in &next[i] {
                // Stored offsets never go back.
                let floor = t.committed.0.get(tp).copied().unwrap_or(*o);
                let c = target.0.entry(tp.clone()).or_insert(*o);
                *c = (*c).max(*o).max(floor);
            }
            t.target = Some(target);
            t.extra.extend(offset_anomalies(&gaps[i], &resets[i]));
            t.rounds_without_commit += 1;
        }
        self.update_uncommitted();
        // A commit already waiting for its retry keeps its schedule.
        if self.retry_at.is_some() && !self.closing {
            return Ok(());
        }
        self.commit_all().await
    }

    /// Commits every table that has something to commit, several at a time (each table
    /// is its own compare-and-swap). A transient failure schedules another attempt
    /// (backoff) and keeps what was not committed.
    async fn commit_all(&mut self) -> Result<(), Halt> {
        let started = Instant::now();
        let jobs = self.commit_jobs();
        let give_up = self.give_up();
        let mut slots: Vec<Option<&mut CommitTable>> = self.tables.iter_mut().map(Some).collect();
        let commits = jobs.into_iter().map(|job| {
            let t = slots[job.table].take().expect("one commit per table");
            let give_up = give_up.clone();
            async move {
                let result = t
                    .sink
                    .commit(&job.expected, &job.target, job.extra, give_up.wait())
                    .await;
                if result.is_ok() {
                    // Landed, not recorded yet: other tables' commits may be in flight.
                    failpoint::hit(failpoint::AFTER_COMMIT);
                }
                (job.table, job.target, result)
            }
        });
        let results: Vec<_> = futures::stream::iter(commits)
            .buffer_unordered(CONCURRENT_COMMITS)
            .collect()
            .await;
        drop(slots);
        // What landed is recorded whatever happened to the other tables; then the worst
        // failure decides (fatal, then fenced, then transient).
        let mut failed: Vec<(usize, SinkError)> = Vec::new();
        for (i, target, result) in results {
            match result {
                Ok(outcome) => self.committed(i, target, outcome, started),
                Err(e) => failed.push((i, e)),
            }
        }
        failed.sort_by_key(|(_, e)| match e {
            SinkError::Fenced(_) => 1,
            e if e.class() == ErrorClass::Transient => 2,
            _ => 0,
        });
        let transient: Vec<usize> = failed
            .iter()
            .filter(|(_, e)| {
                !matches!(e, SinkError::Fenced(_)) && e.class() == ErrorClass::Transient
            })
            .map(|(i, _)| *i)
            .collect();
        if let Some((i, e)) = failed.into_iter().next() {
            match e {
                SinkError::Fenced(reason) => {
                    telemetry::fenced(self.name());
                    return Err(Halt::Rewind(format!("commit fenced: {reason}")));
                }
                e if e.class() == ErrorClass::Transient => {
                    let wait = self.attempts.retry_after(e.class());
                    let failing_for = self
                        .failing_since
                        .get_or_insert_with(Instant::now)
                        .elapsed();
                    let Some(wait) = wait
                        .filter(|_| !self.past_shutdown_grace() && failing_for < COMMIT_GIVE_UP)
                    else {
                        if self.closing {
                            tracing::error!(pipeline = %self.name(), error = %e, "stopping: gave up committing the last records (they are read again at the next start)");
                        } else {
                            tracing::error!(pipeline = %self.name(), error = %e, failing_s = failing_for.as_secs(), "gave up committing: the pipeline stops (its records are read again at the next start)");
                        }
                        return Err(self.fatal(e));
                    };
                    telemetry::transient_retry(self.name(), "commit");
                    telemetry::health::transient_failure(self.name(), "catalog", &e.to_string());
                    tracing::warn!(pipeline = %self.name(), table = %self.tables[i].sink.ident(), tables = transient.len(), attempt = self.attempts.failures(), error = %e, retry_in_ms = wait.as_millis() as u64, "commit failed: trying again (data files keep being written meanwhile)");
                    let wait = if self.closing {
                        wait.min(Duration::from_secs(2))
                    } else {
                        wait
                    };
                    self.retry_at = Some(tokio::time::Instant::now() + wait);
                    // The tables may have moved on while they failed.
                    for i in transient {
                        if let Err(reload) = self.tables[i].sink.reload().await {
                            tracing::warn!(pipeline = %self.name(), error = %reload, "reload after a failure failed too");
                        }
                    }
                    return Ok(());
                }
                e => return Err(self.fatal(e)),
            }
        }
        self.attempts.reset();
        self.failing_since = None;
        self.failed_writes.reset();
        self.remember();
        self.update_uncommitted();
        telemetry::health::flush_completed(&self.config.name);
        if let Some(seq) = self.last_seq {
            let _ = self.reports.send(Report::Durable { seq });
        }
        Ok(())
    }

    /// The tables due a commit now, with what each commit records.
    fn commit_jobs(&mut self) -> Vec<CommitJob> {
        let closing = self.closing;
        let mut jobs = Vec::new();
        for (i, t) in self.tables.iter_mut().enumerate() {
            let Some(target) = t.target.clone() else {
                continue;
            };
            if !t.sink.has_uncommitted() {
                let moves = target
                    .0
                    .iter()
                    .any(|(tp, o)| t.committed.0.get(tp) != Some(o));
                if !moves && t.extra.is_empty() {
                    t.target = None;
                    continue;
                }
                // A partition the table has no offsets for yet is recorded at once (its
                // start position must survive a restart: `start = "latest"` applies once).
                let new_partitions = target.0.keys().any(|tp| !t.committed.0.contains_key(tp));
                let due = closing
                    || new_partitions
                    || !t.extra.is_empty()
                    || t.rounds_without_commit >= OFFSETS_ONLY_EVERY;
                if !due || !t.sink.exists() {
                    continue;
                }
            }
            // The fence covers the partitions this commit moves: other agents'
            // partitions are carried forward as found.
            let expected = target
                .0
                .keys()
                .map(|tp| (tp.clone(), t.committed.0.get(tp).copied()))
                .collect();
            jobs.push(CommitJob {
                table: i,
                expected,
                target,
                extra: t.extra.clone(),
            });
        }
        jobs
    }

    /// Records a commit of table `i` that landed.
    fn committed(&mut self, i: usize, target: OffsetMap, outcome: CommitOutcome, started: Instant) {
        let name = self.config.name.clone();
        let t = &mut self.tables[i];
        tracing::info!(pipeline = %name, table = %t.sink.ident(), snapshot_id = outcome.snapshot_id, files = outcome.files, delete_files = outcome.delete_files, rows_written = t.cut.rows, ms = started.elapsed().as_millis() as u64, "committed");
        telemetry::records_out(&name, t.cut.rows);
        telemetry::committed(&name, outcome.files);
        telemetry::bytes_committed(&name, outcome.bytes);
        telemetry::commit_duration(&name, started.elapsed());
        telemetry::health::table_committed(&name, &t.sink.ident().to_string());
        telemetry::health::recovered(&name);
        t.committed = t.committed.merged(&target);
        t.target = None;
        t.extra.clear();
        t.cut = Volume::default();
        t.rounds_without_commit = 0;
        let _ = self.reports.send(Report::Committed {
            table: i,
            offsets: t.committed.clone(),
        });
    }

    /// Sleeps `wait`, cut short by a stop request.
    async fn pause(&mut self, wait: Duration) {
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
    }

    /// When the commit attempts starting now are abandoned: after
    /// [`COMMIT_ATTEMPT_TIMEOUT`], or once a stop's grace has run out.
    fn give_up(&mut self) -> GiveUp {
        self.note_stop_request();
        GiveUp {
            at: tokio::time::Instant::now() + COMMIT_ATTEMPT_TIMEOUT,
            stopping_since: self.closing_since,
            shutdown: self.shutdown.clone(),
        }
    }

    /// Records when a stop was first seen requested.
    fn note_stop_request(&mut self) {
        if self.closing_since.is_none() && *self.shutdown.borrow() {
            self.closing_since = Some(Instant::now());
        }
    }

    /// Whether a stop was requested long enough ago that failing steps are given up.
    fn past_shutdown_grace(&mut self) -> bool {
        self.note_stop_request();
        self.closing_since
            .is_some_and(|t| t.elapsed() >= SHUTDOWN_GRACE)
    }

    fn fatal(&self, e: SinkError) -> Halt {
        Halt::Fatal(PipelineError::sink(self.name())(e))
    }

    /// Drops everything not committed, reloads every table and tells the intake to read
    /// again from what they store.
    async fn rewind(&mut self, reason: &str) -> Result<(), PipelineError> {
        tracing::warn!(pipeline = %self.name(), %reason, "rewinding to the offsets stored in the table(s)");
        self.retry_at = None;
        self.attempts.reset();
        self.last_seq = None;
        let mut states = Vec::with_capacity(self.tables.len());
        for i in 0..self.tables.len() {
            let t = &mut self.tables[i];
            t.sink.discard();
            t.target = None;
            t.extra.clear();
            t.writing = Volume::default();
            t.cut = Volume::default();
            t.written_through.clear();
            let mut attempts = STEP_RETRY.start();
            loop {
                let e = match self.reload(i).await {
                    Ok(()) => break,
                    Err(e) => e,
                };
                match attempts.retry_after(e.class()) {
                    Some(wait) => {
                        telemetry::transient_retry(self.name(), "reload");
                        tracing::warn!(pipeline = %self.name(), attempt = attempts.failures(), error = %e, "transient failure reloading a table: retrying");
                        self.pause(wait).await;
                        if self.past_shutdown_grace() {
                            return Err(PipelineError::sink(self.name())(e));
                        }
                    }
                    None => return Err(PipelineError::sink(self.name())(e)),
                }
            }
            let t = &self.tables[i];
            states.push(TableState {
                committed: t.committed.clone(),
                schema: t.sink.current_schema(),
                exists: t.sink.exists(),
            });
        }
        self.update_uncommitted();
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
}

/// When a commit attempt is abandoned (see [`Committer::give_up`]).
#[derive(Clone)]
struct GiveUp {
    at: tokio::time::Instant,
    stopping_since: Option<Instant>,
    shutdown: watch::Receiver<bool>,
}

impl GiveUp {
    /// Completes at the time limit, or when a stop's grace runs out (a stop requested
    /// while the attempt runs included).
    async fn wait(mut self) {
        let grace_over = async {
            let since = match self.stopping_since {
                Some(since) => since,
                None => {
                    let asked = self.shutdown.wait_for(|stop| *stop).await.is_ok();
                    if !asked {
                        // No one can ask for a stop any more.
                        return std::future::pending().await;
                    }
                    Instant::now()
                }
            };
            tokio::time::sleep_until((since + SHUTDOWN_GRACE).into()).await;
        };
        tokio::select! {
            () = tokio::time::sleep_until(self.at) => {}
            () = grace_over => {}
        }
    }
}

/// Sleeps until `at` (for ever when `None`: the `select!` branch is disabled then).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

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
        (floe_iceberg::GAP_KEY, gaps),
        (floe_iceberg::RESET_KEY, resets),
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
    use tokio::sync::mpsc;

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
    /// sends its closing mark in the old one: the records are read again next time, and
    /// the intake must still hear that closing is done (it waited forever, and SIGTERM
    /// never ended the agent).
    #[tokio::test]
    async fn a_closing_mark_from_before_a_rewind_still_ends_the_pipeline() {
        let config = crate::config::Config::parse(CONFIG, &|_| None).unwrap();
        let (reports, heard) = crossbeam_channel::unbounded();
        let (_stop, shutdown) = watch::channel(false);
        let map = Arc::new(TableMap::new(&config.pipelines[0]));
        let mut committer = Committer::new(
            Arc::new(config.pipelines[0].clone()),
            Vec::new(),
            map,
            Arc::default(),
            reports,
            Arc::default(),
            shutdown,
        );
        committer.epoch = 1;
        let (marks, inbox) = mpsc::channel(1);
        marks
            .send(Handoff::Mark(Mark {
                epoch: 0,
                seq: 0,
                closing: true,
                next: Default::default(),
                gaps: Default::default(),
                resets: Default::default(),
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
        drop(marks);
        run.await.unwrap().unwrap();
    }
}
