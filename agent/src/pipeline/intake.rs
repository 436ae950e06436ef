//! The intake thread: source events in, chunks of rows and interval marks out.
//!
//! Per message: skip what is already buffered or stored, decode the key and the value
//! (one parse), run the plugins, let each table's schema stage admit the row, append it
//! to the table's Arrow buffer. A buffer that fills is handed to the committer as a
//! chunk (it streams into the table's open data files); every `commit_interval` (or past
//! `max_uncommitted_bytes` written) the rest follows with a mark that commits it all.
//! Rejected records go to the dead-letter file with their original bytes; each mark
//! logs them by reason with a count. Everything here is blocking work (parsing,
//! WebAssembly, fsync), which is why it runs on its own thread and not on an async
//! worker.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use tokio::sync::mpsc;

use super::handoff::{Chunk, Handoff, Mark, Report};
use super::tables::TableMap;
use super::{PipelineError, TableOpener, tracker_for};
use crate::batch::{ROW_OVERHEAD, RowBuffer, RowMeta};
use crate::config::PipelineConfig;
use crate::dead_letter::{DeadLetterWriter, Summary};
use crate::decode::{Decoded, Decoder};
use crate::error::{Classify, ErrorClass, retry};
use crate::record::json::{JsonView, Obj, Parsed, Tape, Tapes};
use crate::record::{Message, PartitionMap, TopicPartition};
use crate::schema::{Admission, SchemaOptions, TableSchema};
use crate::sink::TableSink;
use crate::source::{Assignment, Source, SourceCommand, SourceError, SourceEvent, resume_position};
use crate::telemetry;
use crate::transform::{
    ChainInput, ChainResult, OnError, Produced, Releaser, TransformChain, TransformError,
};
use floe_iceberg::OffsetMap;

/// Requests from the pipeline's owner.
#[derive(Debug)]
pub(super) enum Control {
    /// Commit what is buffered and stop.
    Shutdown,
}

/// A table's buffer is handed over as a chunk past a quarter of a row group (at most
/// this many bytes)...
const CHUNK_BYTES: u64 = 8 * 1024 * 1024;
/// ... or this many rows.
const CHUNK_ROWS: usize = 64 * 1024;

/// While the catalog or the registry is unreachable the intake waits and asks again,
/// until it answers or a stop is requested.
const OUTAGE_RETRY: retry::Policy =
    retry::Policy::backoff(Duration::from_millis(200), Duration::from_secs(30));

/// One output table as the intake sees it.
pub(super) struct IntakeTable {
    schema: TableSchema,
    buffer: RowBuffer,
    /// Next offset per partition the table stores (never decreases).
    committed: OffsetMap,
    /// Whether the table exists in the catalog.
    exists: bool,
}

impl IntakeTable {
    pub(super) fn new(schema: TableSchema, committed: OffsetMap, exists: bool) -> IntakeTable {
        IntakeTable {
            schema,
            buffer: RowBuffer::new(),
            committed,
            exists,
        }
    }

    /// Whether the table already holds the record at `offset` of `tp`.
    fn holds(&self, tp: &TopicPartition, offset: i64) -> bool {
        self.committed.0.get(tp).is_some_and(|&c| offset < c)
    }
}

/// Bookkeeping of the read position.
#[derive(Default)]
struct State {
    /// Next offset expected per assigned partition.
    next: PartitionMap<i64>,
    /// Where the current interval's records start per partition.
    from: PartitionMap<i64>,
    /// `next` as of the last mark handed over.
    last_marked: PartitionMap<i64>,
    /// Rows were handed over since the last mark.
    handed_rows: bool,
    /// Marks handed over so far.
    marks: u64,
    /// Where the dead-letter file ended at each mark not yet committed everywhere.
    letters_at_mark: std::collections::VecDeque<(u64, crate::dead_letter::Position)>,
    /// Where it ended at the newest mark committed everywhere (a rewind drops what
    /// follows: those records are judged again).
    letters_committed: Option<crate::dead_letter::Position>,
    /// Where a partition without stored offsets started (`start = "latest"`: the end at
    /// its first assignment), for rewinds before its first commit.
    first_position: PartitionMap<i64>,
    /// Partitions assigned with neither a position nor stored offsets (the source reads
    /// from where it likes, such as an end it could not tell): the first record read is
    /// where reading started, kept in `first_position`.
    unpositioned: HashSet<TopicPartition>,
    assigned: HashSet<TopicPartition>,
    gaps: PartitionMap<(i64, i64)>,
    resets: PartitionMap<(i64, i64)>,
    epoch: u64,
    phase: Phase,
    consecutive_faults: u32,
    tape: Tape,
    /// The tapes of a batch's records for the plugins (kept for their memory).
    tapes: Tapes,
    last_commit: Option<Instant>,
    /// Records newly dead-lettered since the last mark, for the log.
    dead_lettered: Summary,
}

/// Where the intake is in its protocol with the committer. [`Phase::allows`] lists the
/// transitions; [`Intake::enter`] makes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    /// Reading records and marking every interval.
    #[default]
    Reading,
    /// A rewind was requested: records are ignored until the committer answers.
    /// `then_close`: a stop was requested meanwhile (the closing mark follows the
    /// rewind).
    Rewinding { then_close: bool },
    /// The closing mark is handed over: only the committer's last report matters.
    /// (A rewind the committer starts on its own can still arrive: reading does not
    /// resume.)
    Closing,
}

impl Phase {
    /// Whether the intake may go from this phase to `to`: every transition there is.
    fn allows(self, to: Phase) -> bool {
        use Phase::{Closing, Reading, Rewinding};
        matches!(
            (self, to),
            // A plugin fault or a plugin call interrupted: what is buffered is dropped
            // and read again once the committer has rewound.
            (Reading, Rewinding { then_close: false })
                // The closing mark is handed over.
                | (Reading, Closing)
                // A stop is requested while rewinding: the closing mark follows.
                | (Rewinding { .. }, Rewinding { then_close: true })
                // The committer rewound: reading resumes (to hand over the closing
                // mark at once, with `then_close`).
                | (Rewinding { .. }, Reading)
        )
    }
}

impl State {
    fn rewinding(&self) -> bool {
        matches!(self.phase, Phase::Rewinding { .. })
    }

    fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }
}

/// The stages the intake runs each record through.
pub(super) struct Stages {
    /// Decodes keys and values.
    pub decoder: Decoder,
    /// The pipeline's plugins (empty without any).
    pub chain: TransformChain,
    /// Where rejected records go.
    pub dead_letters: DeadLetterWriter,
}

/// The pipeline's tables as the intake starts with them, and how it opens more.
pub(super) struct Tables {
    /// One per table of `map`, in its order.
    pub tables: Vec<IntakeTable>,
    /// The pipeline's tables by index (grows with a table per topic).
    pub map: Arc<TableMap>,
    /// Opens the table of a new topic.
    pub opener: TableOpener,
    /// The schema options new tables start with.
    pub options: Arc<SchemaOptions>,
}

/// The intake's channels to the committer and from the pipeline's owner.
pub(super) struct Links {
    /// Chunks, marks and rewinds to the committer.
    pub handoffs: mpsc::Sender<Handoff>,
    /// The committer's answers.
    pub reports: Receiver<Report>,
    /// Requests from the pipeline's owner.
    pub control: Receiver<Control>,
    /// Bytes the committer wrote and has not committed (an early mark past the bound).
    pub uncommitted: Arc<AtomicU64>,
}

/// The intake of one pipeline.
pub(super) struct Intake {
    config: Arc<PipelineConfig>,
    decoder: Decoder,
    chain: TransformChain,
    dead_letters: DeadLetterWriter,
    tables: Vec<IntakeTable>,
    /// Stream name to table index (the pipeline's own table is 0, streams follow).
    routes: HashMap<String, usize>,
    /// With a table per topic: each topic's table (else every record's table is 0).
    by_topic: HashMap<Arc<str>, usize>,
    /// The pipeline's tables by index (grows with a table per topic).
    map: Arc<TableMap>,
    /// Opens the table of a new topic.
    opener: TableOpener,
    /// The schema options new tables start with.
    options: Arc<SchemaOptions>,
    source: Box<dyn Source>,
    handoffs: mpsc::Sender<Handoff>,
    /// Bytes the committer wrote and has not committed (an early mark past the bound).
    uncommitted: Arc<AtomicU64>,
    reports: Receiver<Report>,
    control: Receiver<Control>,
    /// For the async calls made from the intake thread (opening tables, the registry).
    runtime: tokio::runtime::Handle,
    state: State,
}

enum Flow {
    Go,
    Done,
}

/// A decoded record on its way to the plugins.
struct Pending<'m> {
    /// Index of its message in the batch.
    message: usize,
    /// Its `_kafka_key` text when the key is not a plain string.
    key: Option<String>,
    value: PendingValue<'m>,
}

enum PendingValue<'m> {
    /// Plain JSON, parsed into the batch's tapes.
    Parsed(Parsed<'m>),
    /// Decoded from another format (or with a schema).
    Decoded(Decoded),
}

impl Pending<'_> {
    fn view<'a>(&'a self, tapes: &'a Tapes) -> JsonView<'a> {
        match &self.value {
            PendingValue::Parsed(p) => tapes.view(*p),
            PendingValue::Decoded(d) => d.value.view(),
        }
    }

    fn declared(&self) -> Option<&Arc<iceberg::spec::StructType>> {
        match &self.value {
            PendingValue::Parsed(_) => None,
            PendingValue::Decoded(d) => d.declared.as_ref(),
        }
    }
}

/// A row ready for a table, before admission.
struct Candidate<'a> {
    message: &'a Message,
    key: Option<&'a str>,
    value: Option<Obj<'a>>,
    declared: Option<&'a Arc<iceberg::spec::StructType>>,
    /// Declared types are hints only (the value went through plugins).
    hints_only: bool,
}

impl Intake {
    /// The intake of pipeline `config`, reading from `source`, in phase
    /// [`Phase::Reading`]. What the dead-letter file holds now was written by earlier
    /// runs.
    ///
    /// # Panics
    /// Outside a tokio runtime (its handle runs the intake's async calls).
    pub(super) fn new(
        config: Arc<PipelineConfig>,
        stages: Stages,
        tables: Tables,
        source: Box<dyn Source>,
        links: Links,
    ) -> Intake {
        let Stages {
            decoder,
            chain,
            dead_letters,
        } = stages;
        let Tables {
            tables,
            map,
            opener,
            options,
        } = tables;
        let routes = config
            .sink
            .streams
            .keys()
            .cloned()
            .zip(1..)
            .collect::<HashMap<String, usize>>();
        let mut by_topic = HashMap::new();
        if map.per_topic() {
            for topic in &config.source.topics {
                let topic = Arc::<str>::from(topic.as_str());
                let i = map.covering(&(topic.clone(), 0)).start;
                by_topic.insert(topic, i);
            }
        }
        let state = State {
            letters_committed: Some(dead_letters.position()),
            ..State::default()
        };
        Intake {
            config,
            decoder,
            chain,
            dead_letters,
            tables,
            routes,
            by_topic,
            map,
            opener,
            options,
            source,
            handoffs: links.handoffs,
            uncommitted: links.uncommitted,
            reports: links.reports,
            control: links.control,
            runtime: tokio::runtime::Handle::current(),
            state,
        }
    }

    /// Moves to phase `to`, if [`Phase::allows`] it (any other move is a bug, which
    /// stops the pipeline).
    fn enter(&mut self, to: Phase) -> Result<(), PipelineError> {
        let from = self.state.phase;
        if !from.allows(to) {
            return Err(PipelineError::internal(
                self.name(),
                format!("the intake cannot go from phase {from:?} to {to:?}"),
            ));
        }
        self.state.phase = to;
        Ok(())
    }

    fn name(&self) -> &str {
        &self.config.name
    }

    fn err_dl(&self, e: crate::dead_letter::DeadLetterError) -> PipelineError {
        PipelineError::DeadLetter {
            pipeline: self.name().to_string(),
            source: Box::new(e),
        }
    }

    /// Runs until the pipeline stops; the source is shut down on the way out.
    pub(super) fn run(mut self) -> Result<(), PipelineError> {
        let result = self.run_loop();
        let source = std::mem::replace(&mut self.source, Box::new(Stopped));
        source.shutdown();
        result
    }

    fn run_loop(&mut self) -> Result<(), PipelineError> {
        let interval = self.config.sink.commit_interval;
        let mut events = self.source.events().clone();
        let reports = self.reports.clone();
        let mut control = self.control.clone();
        let mut last_mark = Instant::now();
        let started = Instant::now();
        let mut last_gauges = started
            .checked_sub(Duration::from_secs(1))
            .unwrap_or(started);
        loop {
            // Closing or rewinding, nothing is marked until the committer reports: wait
            // for it (the interval has long passed; a zero wait would spin).
            let wait = if self.state.phase != Phase::Reading {
                Duration::from_millis(250)
            } else {
                interval
                    .saturating_sub(last_mark.elapsed())
                    .min(Duration::from_millis(250))
            };
            crossbeam_channel::select! {
                recv(reports) -> r => {
                    let Ok(report) = r else {
                        return Err(PipelineError::internal(self.name(), "the committer stopped"));
                    };
                    if let Flow::Done = self.on_report(report)? {
                        return Ok(());
                    }
                }
                recv(control) -> c => {
                    // `Shutdown`, or the owner is gone: stop either way (and stop
                    // listening to a closed channel, which is always ready).
                    if c.is_err() {
                        control = crossbeam_channel::never();
                    }
                    match self.state.phase {
                        Phase::Reading => self.mark(true)?,
                        Phase::Rewinding { .. } => {
                            self.enter(Phase::Rewinding { then_close: true })?;
                        }
                        Phase::Closing => {}
                    }
                }
                recv(events) -> e => match e {
                    Ok(event) if !self.state.closing() => self.on_event(event)?,
                    Ok(_) => {}
                    Err(_) => {
                        if self.state.closing() {
                            // Only the committer's last report matters now.
                            events = crossbeam_channel::never();
                            continue;
                        }
                        return Err(self.source_err(SourceError::Stopped("source channel closed".into())));
                    }
                },
                default(wait) => {}
            }
            // The clock gauges, a few times a second rather than per event.
            if last_gauges.elapsed() >= Duration::from_millis(200) {
                last_gauges = Instant::now();
                let since = self.state.last_commit.unwrap_or(started).elapsed();
                telemetry::seconds_since_last_commit(self.name(), since.as_secs_f64());
                let next = interval.saturating_sub(last_mark.elapsed());
                telemetry::seconds_to_next_commit(self.name(), next.as_secs_f64());
            }
            if self.state.phase != Phase::Reading {
                continue;
            }
            // One commit per interval; earlier only once a lot is written and not
            // committed (a catalog outage, or a very fast stream with a long interval).
            let due = last_mark.elapsed() >= interval;
            let full = self.state.handed_rows
                && self.uncommitted.load(Ordering::Relaxed)
                    >= self.config.sink.max_uncommitted_bytes;
            if due || full {
                self.mark(false)?;
                last_mark = Instant::now();
            }
        }
    }

    fn source_err(&self, e: SourceError) -> PipelineError {
        PipelineError::Source {
            pipeline: self.name().to_string(),
            source: Box::new(e),
        }
    }

    fn on_event(&mut self, event: SourceEvent) -> Result<(), PipelineError> {
        match event {
            SourceEvent::Records(epoch, messages) => {
                if epoch == self.state.epoch && self.state.phase == Phase::Reading {
                    self.accept(messages)?;
                    self.hand_off_full()?;
                }
            }
            SourceEvent::Assigned(assignments) => {
                self.add_tables(&assignments)?;
                for a in assignments {
                    for (t, stored) in self.tables.iter_mut().zip(&a.stored) {
                        if let Some(o) = stored {
                            let c = t.committed.0.entry(a.tp.clone()).or_insert(*o);
                            *c = (*c).max(*o);
                        }
                    }
                    match a.position {
                        Some(p) => {
                            self.state.next.insert(a.tp.clone(), p);
                            self.state.from.insert(a.tp.clone(), p);
                            if a.stored.iter().all(Option::is_none) {
                                self.state.first_position.insert(a.tp.clone(), p);
                            }
                        }
                        None => {
                            // The source reads from where it likes: what every table
                            // already holds is skipped all the same (not dead-lettered
                            // again, not buffered twice).
                            let held = self
                                .map
                                .covering(&a.tp)
                                .map(|i| a.stored.get(i).copied().flatten())
                                .collect::<Option<Vec<i64>>>()
                                .and_then(|v| v.into_iter().min());
                            match held {
                                Some(h) => self.state.next.insert(a.tp.clone(), h),
                                None => self.state.next.remove(&a.tp),
                            };
                            if a.stored.iter().all(Option::is_none) {
                                self.state.unpositioned.insert(a.tp.clone());
                            }
                            self.state.from.remove(&a.tp);
                        }
                    }
                    self.state.assigned.insert(a.tp);
                }
                telemetry::health::partitions_assigned(self.name(), self.state.assigned.len());
            }
            SourceEvent::Revoked(tps) => {
                let revoked: HashSet<TopicPartition> = tps.into_iter().collect();
                // Rows of a revoked partition may already be in open data files: they
                // cannot be taken out, so they are committed now with the offsets they
                // cover (or fenced, if the new owner commits first). Rows still
                // buffered are simply dropped otherwise.
                let read_since_mark =
                    |tp: &TopicPartition| self.state.next.get(tp) != self.state.last_marked.get(tp);
                if self.state.handed_rows
                    && !self.state.rewinding()
                    && revoked.iter().any(read_since_mark)
                {
                    self.mark(false)?;
                }
                for t in &mut self.tables {
                    t.buffer
                        .retain(|tp| !revoked.contains(tp))
                        .map_err(|e| PipelineError::internal(&self.config.name, e.to_string()))?;
                }
                for tp in &revoked {
                    self.state.assigned.remove(tp);
                    self.state.next.remove(tp);
                    self.state.from.remove(tp);
                    self.state.last_marked.remove(tp);
                    self.state.gaps.remove(tp);
                    self.state.resets.remove(tp);
                    self.state.first_position.remove(tp);
                    self.state.unpositioned.remove(tp);
                }
                telemetry::health::partitions_assigned(self.name(), self.state.assigned.len());
            }
            SourceEvent::Gap {
                tp,
                expected,
                found,
            } => {
                telemetry::offset_gap(self.name(), (found - expected).max(0) as u64);
                self.state.gaps.insert(tp, (expected, found));
            }
            SourceEvent::Reset {
                tp,
                expected,
                found,
            } => {
                telemetry::offset_reset(self.name());
                self.state.resets.insert(tp, (expected, found));
            }
            SourceEvent::Failed(reason) => {
                return Err(self.source_err(SourceError::Stopped(reason)));
            }
        }
        Ok(())
    }

    /// Decodes, transforms and buffers a batch of messages.
    fn accept(&mut self, messages: Vec<Message>) -> Result<(), PipelineError> {
        telemetry::records_in(self.name(), messages.len() as u64);
        self.prepare(&messages)?;
        let fast = self.decoder.is_json() && self.chain.is_empty();
        // For the plugins, plain JSON is parsed into tapes shared by the batch.
        let into_tapes = self.decoder.is_json() && !self.chain.is_empty();
        let mut tapes = std::mem::take(&mut self.state.tapes);
        tapes.clear();
        let mut decoded: Vec<Pending<'_>> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let tp = m.topic_partition();
            if !self.state.unpositioned.is_empty() && self.state.unpositioned.remove(&tp) {
                self.state.first_position.insert(tp.clone(), m.offset);
            }
            let next = self.state.next.entry(tp.clone()).or_insert(m.offset);
            if m.offset < *next {
                // Already buffered or stored (re-delivery after a rebalance or seek).
                continue;
            }
            *next = m.offset + 1;
            self.state.from.entry(tp).or_insert(m.offset);
            let key = match self.decode_key(m)? {
                Ok(k) => k,
                Err(reason) => {
                    self.dead_letter(m, "decode", &reason)?;
                    continue;
                }
            };
            let Some(bytes) = &m.value else {
                // A tombstone is a row with only the Kafka columns; plugins never see it.
                let key = key.as_deref().or_else(|| utf8_key(m));
                let table = self.home(m);
                self.offer(
                    table,
                    Candidate {
                        message: m,
                        key,
                        value: None,
                        declared: None,
                        hints_only: false,
                    },
                )?;
                continue;
            };
            if fast {
                // The hot path: one parse into a reused tape, straight into the buffer.
                let mut tape = std::mem::take(&mut self.state.tape);
                let table = self.home(m);
                let result = match tape.parse(bytes) {
                    Ok(view) => self.offer(
                        table,
                        Candidate {
                            message: m,
                            key: key.as_deref().or_else(|| utf8_key(m)),
                            value: Some(view.root()),
                            declared: None,
                            hints_only: false,
                        },
                    ),
                    Err(e) => self.dead_letter(m, "decode", &e.to_string()),
                };
                self.state.tape = tape;
                result?;
                continue;
            }
            if into_tapes {
                match tapes.parse(bytes) {
                    Ok(parsed) => decoded.push(Pending {
                        message: i,
                        key,
                        value: PendingValue::Parsed(parsed),
                    }),
                    Err(e) => self.dead_letter(m, "decode", &e.to_string())?,
                }
                continue;
            }
            match self.decoder.decode_value(bytes) {
                Ok(d) => decoded.push(Pending {
                    message: i,
                    key,
                    value: PendingValue::Decoded(d),
                }),
                Err(e) if e.class() == ErrorClass::BadRecord => {
                    self.dead_letter(m, "decode", &e.to_string())?
                }
                Err(e) => return Err(self.decode_failed(m, e)),
            }
        }
        let result = if decoded.is_empty() {
            Ok(())
        } else if self.chain.is_empty() {
            self.offer_all(&messages, &decoded, &tapes)
        } else {
            self.transform(&messages, &decoded, &tapes)
        };
        self.state.tapes = tapes;
        result
    }

    /// With a table per topic: opens the tables of newly assigned topics and hands them
    /// to the committer (before any of their rows).
    fn add_tables(&mut self, assignments: &[Assignment]) -> Result<(), PipelineError> {
        if !self.map.per_topic() {
            return Ok(());
        }
        for a in assignments {
            if !self.by_topic.contains_key(&a.tp.0) {
                let i = self.map.covering(&a.tp).start;
                self.by_topic.insert(a.tp.0.clone(), i);
            }
        }
        while self.tables.len() < self.map.len() {
            let name = self.map.name(self.tables.len());
            let sink = self.open_table(&name)?;
            let table = super::intake_table(&self.config, &sink, &self.options)?;
            tracing::info!(pipeline = %self.name(), table = %sink.ident(), exists = sink.exists(), "a new topic: writing its table");
            if self
                .handoffs
                .blocking_send(Handoff::AddTable(Box::new(sink)))
                .is_err()
            {
                return Err(self.committer_gone());
            }
            self.tables.push(table);
        }
        Ok(())
    }

    /// Opens table `name`, retrying while the catalog is unreachable.
    fn open_table(&mut self, name: &str) -> Result<TableSink, PipelineError> {
        let mut attempts = OUTAGE_RETRY.start();
        loop {
            let e = match self.runtime.block_on(self.opener.open(&self.config, name)) {
                Ok(sink) => return Ok(sink),
                Err(e) => e,
            };
            let wait = attempts.retry_after(e.class());
            let Some(wait) = wait.filter(|_| !self.stop_requested()) else {
                return Err(e);
            };
            tracing::warn!(pipeline = %self.name(), table = %name, error = %e, attempt = attempts.failures(), retry_in_ms = wait.as_millis() as u64, "cannot open the table: retrying");
            telemetry::health::transient_failure(self.name(), "catalog", &e.to_string());
            std::thread::sleep(wait);
        }
    }

    /// The table a record goes to unless a plugin routes it: its topic's with a table
    /// per topic, else the pipeline's table.
    fn home(&self, m: &Message) -> usize {
        if self.by_topic.is_empty() {
            // The usual case: no per-record hashing of the topic name.
            return 0;
        }
        self.by_topic.get(&m.topic).copied().unwrap_or(0)
    }

    /// Offers decoded records as they are (no plugins).
    fn offer_all(
        &mut self,
        messages: &[Message],
        decoded: &[Pending<'_>],
        tapes: &Tapes,
    ) -> Result<(), PipelineError> {
        for p in decoded {
            let m = &messages[p.message];
            let table = self.home(m);
            self.offer(
                table,
                Candidate {
                    message: m,
                    key: p.key.as_deref().or_else(|| utf8_key(m)),
                    value: Some(p.view(tapes).root()),
                    declared: p.declared(),
                    hints_only: false,
                },
            )?;
        }
        Ok(())
    }

    /// Fetches the registry schemas a batch refers to, retrying while the registry is
    /// unreachable (a transient failure: nothing is dead-lettered for it).
    fn prepare(&mut self, messages: &[Message]) -> Result<(), PipelineError> {
        let values = self
            .decoder
            .values_use_registry()
            .then(|| messages.iter().filter_map(|m| m.value.as_deref()))
            .into_iter()
            .flatten();
        let keys = self
            .decoder
            .keys_use_registry()
            .then(|| messages.iter().filter_map(|m| m.key.as_deref()))
            .into_iter()
            .flatten();
        let ids = self.decoder.missing_ids(values.chain(keys));
        if ids.is_empty() {
            return Ok(());
        }
        let mut attempts = OUTAGE_RETRY.start();
        loop {
            let e = match self.runtime.block_on(self.decoder.fetch(ids.clone())) {
                Ok(()) => {
                    if attempts.failures() > 0 {
                        telemetry::health::recovered(self.name());
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            let wait = attempts.retry_after(e.class());
            let Some(wait) = wait.filter(|_| !self.stop_requested()) else {
                return Err(PipelineError::Decode {
                    pipeline: self.name().to_string(),
                    source: Box::new(e),
                });
            };
            tracing::warn!(pipeline = %self.name(), error = %e, attempt = attempts.failures(), retry_in_ms = wait.as_millis() as u64, "schema registry unreachable: retrying");
            telemetry::health::transient_failure(self.name(), "registry", &e.to_string());
            std::thread::sleep(wait);
        }
    }

    fn stop_requested(&self) -> bool {
        !self.control.is_empty()
    }

    /// The `_kafka_key` text of a message whose key is not a plain string, or why it
    /// cannot be decoded (`Ok(None)`: the key is stored as it is, or there is none).
    fn decode_key(&self, m: &Message) -> Result<Result<Option<String>, String>, PipelineError> {
        let Some(key) = &m.key else {
            return Ok(Ok(None));
        };
        if self.decoder.key_is_string() {
            return Ok(match std::str::from_utf8(key) {
                Ok(_) => Ok(None),
                Err(_) => Err(
                    "message key is not UTF-8 (the _kafka_key column is a string; \
                     `key_format = \"base64\"` stores any key)"
                        .into(),
                ),
            });
        }
        match self.decoder.decode_key(key) {
            Ok(text) => Ok(Ok(Some(text))),
            Err(e) if e.class() == ErrorClass::BadRecord => Ok(Err(e.to_string())),
            Err(e) => Err(self.decode_failed(m, e)),
        }
    }

    /// A decode error that is not the record's fault alone (registry gone, or a schema
    /// violation under `on_incompatible = "fail"`): the pipeline stops, naming the record.
    fn decode_failed(&self, m: &Message, e: crate::decode::DecodeError) -> PipelineError {
        PipelineError::DecodeFailed {
            pipeline: self.name().to_string(),
            topic: m.topic.to_string(),
            partition: m.partition,
            offset: m.offset,
            source: Box::new(e),
        }
    }

    /// Runs decoded records through the plugin chain and offers what comes out.
    fn transform(
        &mut self,
        messages: &[Message],
        decoded: &[Pending<'_>],
        tapes: &Tapes,
    ) -> Result<(), PipelineError> {
        // The chain reads each record's parsed value with its Kafka metadata.
        let inputs: Vec<ChainInput<'_>> = decoded
            .iter()
            .map(|p| {
                let m = &messages[p.message];
                ChainInput {
                    value: p.view(tapes),
                    topic: &m.topic,
                    partition: m.partition,
                    offset: m.offset,
                    timestamp_ms: m.timestamp_ms,
                    key: p.key.as_deref().map(str::as_bytes).or(m.key.as_deref()),
                }
            })
            .collect();
        // Parts of the batch come back in order while the plugins run the next parts.
        let mut chain = std::mem::take(&mut self.chain);
        let releaser = chain.releaser();
        let mut outcome = Ok(());
        chain.run_parts(&inputs, |part| {
            outcome = self.take_part(messages, decoded, &inputs, part, &releaser);
            outcome.is_ok() && !self.state.rewinding()
        });
        self.chain = chain;
        outcome?;
        // Only a whole batch without a fault ends a run of faulted batches.
        if !self.state.rewinding() {
            self.state.consecutive_faults = 0;
        }
        Ok(())
    }

    /// Offers the outputs of one part of a batch and handles its record errors, or
    /// rewinds when the part failed.
    fn take_part(
        &mut self,
        messages: &[Message],
        decoded: &[Pending<'_>],
        inputs: &[ChainInput<'_>],
        part: Result<ChainResult, TransformError>,
        releaser: &Releaser,
    ) -> Result<(), PipelineError> {
        let result = match part {
            Ok(r) => r,
            Err(TransformError::Interrupted { .. }) => {
                // Shutting down: nothing of this batch is kept; it is read again on restart.
                return self.request_rewind("a plugin call was interrupted by shutdown".into());
            }
            Err(TransformError::Fault(fault)) => {
                self.state.consecutive_faults += 1;
                telemetry::records_failed(self.name(), "transform_fault");
                if self.state.consecutive_faults >= self.config.max_consecutive_faults {
                    tracing::error!(pipeline = %self.name(), %fault, faults = self.state.consecutive_faults, "plugin faulted too often: stopping");
                    return Err(PipelineError::Transform {
                        pipeline: self.name().to_string(),
                        source: Box::new(fault.into()),
                    });
                }
                tracing::warn!(pipeline = %self.name(), %fault, faults = self.state.consecutive_faults, "plugin fault: dropping uncommitted records, rebuilding the plugin, re-reading");
                return self.request_rewind(fault.to_string());
            }
            Err(other) => {
                return Err(PipelineError::Transform {
                    pipeline: self.name().to_string(),
                    source: Box::new(other),
                });
            }
        };
        for e in &result.errors {
            let m = &messages[decoded[e.origin].message];
            match e.policy {
                OnError::DeadLetter => {
                    telemetry::plugin_record_error(self.name(), &e.plugin, "dead_letter");
                    self.dead_letter(
                        m,
                        "transform",
                        &format!("plugin {}: {}", e.plugin, e.message),
                    )?;
                }
                OnError::Drop => telemetry::plugin_record_error(self.name(), &e.plugin, "drop"),
                OnError::Fail => {
                    telemetry::plugin_record_error(self.name(), &e.plugin, "fail");
                    return Err(PipelineError::RecordFailed {
                        pipeline: self.name().to_string(),
                        plugin: e.plugin.clone(),
                        topic: m.topic.to_string(),
                        partition: m.partition,
                        offset: m.offset,
                        message: e.message.clone(),
                    });
                }
            }
        }
        // Records the plugins built, freed on their threads once buffered.
        let mut spent = Vec::new();
        for out in result.outputs {
            let p = &decoded[out.origin];
            let m = &messages[p.message];
            let table = match &out.route {
                None => self.home(m),
                Some(stream) => match self.routes.get(stream) {
                    Some(&t) => t,
                    None => {
                        let reason = format!(
                            "routed to stream {stream:?}, which has no table in [pipelines.sink.streams]"
                        );
                        self.dead_letter(m, "transform", &reason)?;
                        continue;
                    }
                },
            };
            // Unchanged by every plugin: the value parsed at decoding goes on.
            let value = match &out.value {
                Produced::Unchanged => inputs[out.origin].value,
                Produced::New(v) => v.view(),
            };
            self.offer(
                table,
                Candidate {
                    message: m,
                    key: p.key.as_deref().or_else(|| utf8_key(m)),
                    value: Some(value.root()),
                    declared: p.declared(),
                    hints_only: true,
                },
            )?;
            if let Produced::New(v) = out.value {
                spent.push(v);
            }
        }
        releaser.release(spent);
        Ok(())
    }

    /// Lets table `t` admit a row and buffers it, or applies the verdict.
    fn offer(&mut self, t: usize, c: Candidate<'_>) -> Result<(), PipelineError> {
        let m = c.message;
        let tp = m.topic_partition();
        let table = &mut self.tables[t];
        if table.holds(&tp, m.offset) {
            return Ok(());
        }
        let (declare, hints) = match (c.declared, c.hints_only) {
            (Some(d), false) => (Some(d), Some(&**d)),
            (Some(d), true) => (None, Some(&**d)),
            (None, _) => (None, None),
        };
        let verdict = table.schema.admit(c.value, c.key, declare, hints);
        let admitted = match verdict {
            Admission::Admit(a) => a,
            Admission::Reject { stage, reason } => return self.dead_letter(m, stage, &reason),
            Admission::Fail(rejection) => {
                return Err(PipelineError::Incompatible {
                    pipeline: self.name().to_string(),
                    topic: m.topic.to_string(),
                    partition: m.partition,
                    offset: m.offset,
                    conflict: Box::new(rejection),
                });
            }
        };
        let value = match &admitted.rewritten {
            Some(v) => Some(v.view().root()),
            None => c.value,
        };
        let cost = value.map_or(0, |v| v.raw().len() as u64)
            + c.key.map_or(0, |k| k.len() as u64)
            + m.header_bytes() as u64
            + ROW_OVERHEAD;
        let meta = RowMeta {
            partition: m.partition,
            offset: m.offset,
            timestamp_ms: m.timestamp_ms,
            key: c.key,
            headers: &m.headers,
        };
        let table = &mut self.tables[t];
        table
            .buffer
            .append(&table.schema.tracker, &tp, meta, value, admitted.key, cost)
            .map_err(|e| PipelineError::internal(&self.config.name, e.to_string()))?;
        Ok(())
    }

    fn dead_letter(
        &mut self,
        m: &Message,
        stage: &'static str,
        reason: &str,
    ) -> Result<(), PipelineError> {
        tracing::debug!(pipeline = %self.name(), topic = %m.topic, partition = m.partition, offset = m.offset, stage, reason, "dead-lettered");
        let new = self
            .dead_letters
            .write(m, stage, reason)
            .map_err(|e| self.err_dl(e))?;
        // A record read again after a rewind was counted the first time.
        if new {
            telemetry::records_failed(self.name(), stage);
            telemetry::dead_letter(self.name(), stage);
            self.state.dead_lettered.add(stage, reason, m);
        }
        Ok(())
    }

    /// Hands over the buffers that reached a chunk's size.
    fn hand_off_full(&mut self) -> Result<(), PipelineError> {
        let chunk_bytes = (self.config.sink.row_group_bytes / 4).clamp(16 * 1024, CHUNK_BYTES);
        for t in 0..self.tables.len() {
            let buffer = &self.tables[t].buffer;
            if buffer.bytes() >= chunk_bytes || buffer.rows() >= CHUNK_ROWS {
                self.hand_off(t)?;
            }
        }
        Ok(())
    }

    /// Hands table `t`'s buffered rows to the committer (they stream into its open data
    /// files). From then on rows are checked against the types these were written in.
    fn hand_off(&mut self, t: usize) -> Result<(), PipelineError> {
        let table = &mut self.tables[t];
        if table.buffer.is_empty() {
            return Ok(());
        }
        let buffered = table
            .buffer
            .take()
            .map_err(|e| PipelineError::internal(&self.config.name, e.to_string()))?;
        let tracker = table.schema.tracker.clone();
        table.schema.tracker.lock_all();
        let chunk = Chunk {
            epoch: self.state.epoch,
            table: t,
            buffered,
            tracker,
            from: (!table.exists).then(|| self.state.from.clone()),
        };
        self.state.handed_rows = true;
        if self
            .handoffs
            .blocking_send(Handoff::Rows(Box::new(chunk)))
            .is_err()
        {
            return Err(self.committer_gone());
        }
        Ok(())
    }

    /// Ends a commit interval: hands over what is buffered and a mark with the offsets
    /// everything handed over covers (the committer commits it all).
    fn mark(&mut self, closing: bool) -> Result<(), PipelineError> {
        let any_rows = self.tables.iter().any(|t| !t.buffer.is_empty()) || self.state.handed_rows;
        let anomalies = !self.state.gaps.is_empty() || !self.state.resets.is_empty();
        if !closing && !any_rows && !anomalies && self.state.next == self.state.last_marked {
            // Nothing new: an idle pipeline whose marks are all committed is up to date
            // (a commit still failing keeps its mark pending, and readiness with it).
            if self.state.letters_at_mark.is_empty() && !self.state.rewinding() {
                telemetry::health::flush_completed(self.name());
            }
            return Ok(());
        }
        for t in 0..self.tables.len() {
            self.hand_off(t)?;
        }
        // Dead letters up to here are durable before any commit moves offsets past them.
        self.dead_letters.sync().map_err(|e| self.err_dl(e))?;
        crate::failpoint::hit(crate::failpoint::AFTER_DEAD_LETTERS);
        self.state.dead_lettered.log(&self.config.name);
        self.state.marks += 1;
        self.state
            .letters_at_mark
            .push_back((self.state.marks, self.dead_letters.position()));
        let mark = Mark {
            epoch: self.state.epoch,
            seq: self.state.marks,
            closing,
            next: self.state.next.clone(),
            gaps: std::mem::take(&mut self.state.gaps),
            resets: std::mem::take(&mut self.state.resets),
        };
        self.state.last_marked = self.state.next.clone();
        self.state.from = self.state.next.clone();
        self.state.handed_rows = false;
        if closing {
            self.enter(Phase::Closing)?;
        }
        if self.handoffs.blocking_send(Handoff::Mark(mark)).is_err() {
            return Err(self.committer_gone());
        }
        Ok(())
    }

    /// The committer ended: its report says why.
    fn committer_gone(&mut self) -> PipelineError {
        while let Ok(report) = self.reports.try_recv() {
            if let Report::Failed(e) = report {
                return e;
            }
        }
        PipelineError::internal(self.name(), "the committer stopped")
    }

    /// Asks the committer to rewind once everything handed over earlier is done.
    fn request_rewind(&mut self, reason: String) -> Result<(), PipelineError> {
        self.enter(Phase::Rewinding { then_close: false })?;
        for t in &mut self.tables {
            let _ = t.buffer.take();
        }
        if self
            .handoffs
            .blocking_send(Handoff::Rewind {
                epoch: self.state.epoch,
                reason,
            })
            .is_err()
        {
            return Err(self.committer_gone());
        }
        Ok(())
    }

    fn on_report(&mut self, report: Report) -> Result<Flow, PipelineError> {
        match report {
            Report::Committed { table, offsets } => {
                let t = &mut self.tables[table];
                t.exists = true;
                for (tp, o) in offsets.0 {
                    let c = t.committed.0.entry(tp).or_insert(o);
                    *c = (*c).max(o);
                }
                self.state.last_commit = Some(Instant::now());
                let resume = self.resume();
                self.dead_letters.forget_below(&resume);
                let group: Vec<(TopicPartition, i64)> = self
                    .state
                    .assigned
                    .iter()
                    .filter_map(|tp| resume.get(tp).map(|o| (tp.clone(), *o)))
                    .collect();
                if !group.is_empty() {
                    self.source
                        .command(SourceCommand::CommitGroupOffsets(group));
                }
            }
            Report::Durable { seq } => {
                while let Some(&(at, position)) = self.state.letters_at_mark.front() {
                    if at > seq {
                        break;
                    }
                    self.state.letters_committed = Some(position);
                    self.state.letters_at_mark.pop_front();
                }
            }
            Report::Rewind { epoch, tables } => {
                // Records after the committed offsets are judged again.
                self.state.letters_at_mark.clear();
                if let Some(position) = self.state.letters_committed {
                    self.dead_letters
                        .discard_after(position)
                        .map_err(|e| self.err_dl(e))?;
                }
                for (t, state) in self.tables.iter_mut().zip(tables) {
                    let options = t.schema.tracker.options().clone();
                    t.buffer = RowBuffer::new();
                    t.schema.tracker = tracker_for(state.schema.as_deref(), &options);
                    t.committed = state.committed;
                    t.exists = state.exists;
                }
                self.state.epoch = epoch;
                let then_close = self.state.phase == Phase::Rewinding { then_close: true };
                if self.state.rewinding() {
                    self.enter(Phase::Reading)?;
                }
                let resume = self.resume();
                let mut positions = Vec::new();
                self.state.next.clear();
                self.state.from.clear();
                for tp in &self.state.assigned {
                    let p = resume
                        .get(tp)
                        .or_else(|| self.state.first_position.get(tp))
                        .copied();
                    if let Some(o) = p {
                        self.state.next.insert(tp.clone(), o);
                        self.state.from.insert(tp.clone(), o);
                    }
                    positions.push((tp.clone(), p));
                }
                self.state.last_marked = self.state.next.clone();
                self.state.handed_rows = false;
                self.source
                    .command(SourceCommand::Seek { epoch, positions });
                if then_close {
                    self.mark(true)?;
                }
            }
            Report::Failed(e) => return Err(e),
            Report::Done => return Ok(Flow::Done),
        }
        Ok(Flow::Go)
    }

    /// Where reading continues per partition: the smallest offset any table stores (a
    /// table that exists without the partition needs it from the start).
    fn resume(&self) -> PartitionMap<i64> {
        let mut out = PartitionMap::default();
        let partitions: HashSet<&TopicPartition> = self
            .tables
            .iter()
            .flat_map(|t| t.committed.0.keys())
            .collect();
        for tp in partitions {
            let covering = self.map.covering(tp);
            let tables = &self.tables
                [covering.start.min(self.tables.len())..covering.end.min(self.tables.len())];
            let exists: Vec<bool> = tables.iter().map(|t| t.exists).collect();
            let stored: Vec<Option<i64>> = tables
                .iter()
                .map(|t| t.committed.0.get(tp).copied())
                .collect();
            if let Some(o) = resume_position(&stored, &exists) {
                out.insert(tp.clone(), o);
            }
        }
        out
    }
}

/// The key of a message with `key_format = "string"`, as stored (checked UTF-8 before).
fn utf8_key(m: &Message) -> Option<&str> {
    m.key.as_deref().and_then(|k| std::str::from_utf8(k).ok())
}

/// Placeholder after the source was shut down.
struct Stopped;

impl Source for Stopped {
    fn events(&self) -> &Receiver<SourceEvent> {
        static NEVER: std::sync::OnceLock<Receiver<SourceEvent>> = std::sync::OnceLock::new();
        NEVER.get_or_init(crossbeam_channel::never)
    }
    fn command(&self, _command: SourceCommand) {}
    fn shutdown(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::Phase::{self, Closing, Reading, Rewinding};

    #[test]
    fn the_phase_transition_table() {
        let phases = [
            Reading,
            Rewinding { then_close: false },
            Rewinding { then_close: true },
            Closing,
        ];
        let allowed: Vec<(Phase, Phase)> = phases
            .iter()
            .flat_map(|&from| phases.iter().map(move |&to| (from, to)))
            .filter(|&(from, to)| from.allows(to))
            .collect();
        assert_eq!(
            allowed,
            [
                (Reading, Rewinding { then_close: false }),
                (Reading, Closing),
                (Rewinding { then_close: false }, Reading),
                (
                    Rewinding { then_close: false },
                    Rewinding { then_close: true }
                ),
                (Rewinding { then_close: true }, Reading),
                (
                    Rewinding { then_close: true },
                    Rewinding { then_close: true }
                ),
            ]
        );
        // Closing is final; the intake starts reading.
        assert!(phases.iter().all(|&to| !Closing.allows(to)));
        assert_eq!(Phase::default(), Reading);
    }
}
