//! The Kafka source: one thread polls a `BaseConsumer`.
//!
//! - Records go to the pipeline in batches over a bounded channel. When the channel is
//!   full the thread pauses its partitions and keeps polling (so the group sees it alive
//!   and rebalances are served), and resumes them once the pipeline has caught up: a slow
//!   pipeline applies backpressure instead of growing memory.
//! - The rebalance callback never waits for the pipeline: it positions newly assigned
//!   partitions from the tables (read fresh through a [`PositionLookup`]), and queues the
//!   assignment or revocation as an event in order with the records.
//! - Cooperative incremental rebalancing (`cooperative-sticky`) is the default; the
//!   eager protocol (set through `properties`) works too.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TrySendError};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::message::Headers as _;
use rdkafka::message::Message as _;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{
    PositionLookup, Source, SourceCommand, SourceConfig, SourceError, SourceEvent, StartPosition,
    is_fatal,
};
use crate::record::{Message, PartitionMap, TopicPartition};

/// How many records one event carries at most...
const MAX_EVENT_RECORDS: usize = 4096;
/// ... and how many bytes of keys and values: with megabyte messages a record count
/// alone would put gigabytes in one event.
const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Events queued for the pipeline before the thread waits (a few MiB of usual records,
/// at most this many times `MAX_EVENT_BYTES`).
const EVENT_QUEUE: usize = 8;

/// How long the thread waits for room in the pipeline's channel before it pauses the
/// partitions (rebalance callbacks wait at most this long meanwhile).
const SHORT_STALL: Duration = Duration::from_millis(500);

/// Events queued by the rebalance callback and the poll loop, delivered in order.
type Pending = Arc<Mutex<VecDeque<SourceEvent>>>;

/// Partitions just positioned at a stored offset: the first record read of each tells
/// whether retention removed records in between.
///
/// Read for every message, written only on assignments and seeks: `any` lets a message
/// skip the lock and the lookup while nothing waits for a check (almost always).
#[derive(Default)]
struct Positioned {
    map: Mutex<PartitionMap<i64>>,
    any: AtomicBool,
}

impl Positioned {
    fn insert(&self, tp: TopicPartition, offset: i64) {
        let mut map = self.map.lock().expect("positioned");
        map.insert(tp, offset);
        self.any.store(true, Ordering::Release);
    }

    /// The position a partition was given, if its first record has not been seen yet.
    fn take(&self, topic: &Arc<str>, partition: i32) -> Option<i64> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut map = self.map.lock().expect("positioned");
        let position = map.remove(&(topic.clone(), partition));
        if map.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        position
    }
}

struct Context {
    pipeline: String,
    start: StartPosition,
    lookup: Arc<dyn PositionLookup>,
    pending: Pending,
    positioned: Arc<Positioned>,
    /// `start = "latest"` positions to commit to the group (outside the callback).
    pin: Arc<Mutex<Vec<(TopicPartition, i64)>>>,
    /// Whether the poller has paused its partitions: newly assigned ones are paused too.
    paused: Arc<AtomicBool>,
    /// OAUTHBEARER tokens (OIDC, MSK IAM), when the source uses them.
    tokens: super::oauth::ContextTokens,
    /// librdkafka's transient errors, logged at most once per interval.
    client_errors: ClientErrors,
}

/// librdkafka reports a broker outage once per connection attempt and broker, many
/// times a second: the log gets the first one, then one line per [`Self::INTERVAL`]
/// with how many were left out.
#[derive(Default)]
struct ClientErrors {
    state: Mutex<Option<(std::time::Instant, u64)>>,
}

impl ClientErrors {
    const INTERVAL: Duration = Duration::from_secs(30);

    fn log(&self, pipeline: &str, reason: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match state.as_mut() {
            Some((last, left_out)) if now.duration_since(*last) < Self::INTERVAL => {
                *left_out += 1;
            }
            _ => {
                let left_out = state.map_or(0, |(_, n)| n);
                tracing::warn!(pipeline = %pipeline, error = %reason, similar_left_out = left_out, "Kafka client error");
                *state = Some((now, 0));
            }
        }
    }
}

impl ClientContext for Context {
    super::oauth::oauth_context!(tokens);

    /// librdkafka's own log lines. A `FAIL` line repeats what [`Self::error`] reports
    /// (rate-limited) once per connection attempt, so it goes to debug.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as Level;
        match level {
            _ if fac == "FAIL" => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            Level::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
            Level::Notice | Level::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            Level::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
        }
    }

    /// librdkafka retries a refused login or a failed TLS handshake forever; those need a
    /// fix in the settings, so the pipeline stops with what to check.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        match super::security_failure(&error) {
            Some(what) => {
                tracing::error!(pipeline = %self.pipeline, error = %reason, "{what}");
                self.push(SourceEvent::Failed(format!("{what} ({reason})")));
            }
            None => self.client_errors.log(&self.pipeline, reason),
        }
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                // librdkafka reports -1 for partitions it does not fetch (and the internal -1 partition).
                if *partition >= 0 && p.consumer_lag >= 0 {
                    crate::telemetry::consumer_lag(
                        &self.pipeline,
                        topic,
                        *partition,
                        p.consumer_lag,
                    );
                }
            }
        }
    }
}

impl Context {
    /// `latest` applies once per consumer group: a partition the tables store nothing
    /// for continues at the group's committed offset if it has one; otherwise the end
    /// *now* becomes its position, committed to the group at once (a table may not
    /// exist to record it until records arrive), so a rewind or a restart does not jump
    /// to a later end and skip what came in between.
    fn position_latest(&self, consumer: &BaseConsumer<Self>, assigned: &mut [super::Assignment]) {
        let open: Vec<usize> = (0..assigned.len())
            .filter(|&i| assigned[i].position.is_none())
            .collect();
        if open.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for &i in &open {
            tpl.add_partition(&assigned[i].tp.0, assigned[i].tp.1);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .map_err(|e| tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot read the group's committed offsets"))
            .ok();
        for &i in &open {
            let a = &mut assigned[i];
            let (topic, partition) = (a.tp.0.clone(), a.tp.1);
            let in_group = committed.as_ref().and_then(|c| {
                match c.find_partition(&topic, partition)?.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                }
            });
            if let Some(o) = in_group {
                tracing::info!(pipeline = %self.pipeline, %topic, partition, offset = o, "start = latest: continuing at the group's committed offset (no table stores this partition yet)");
                a.position = Some(o);
                continue;
            }
            // Asked twice: a broker that just restarted may not answer the first time.
            let ends = consumer
                .fetch_watermarks(&topic, partition, Duration::from_secs(5))
                .or_else(|_| consumer.fetch_watermarks(&topic, partition, Duration::from_secs(5)));
            match ends {
                Ok((low, high)) => {
                    tracing::info!(pipeline = %self.pipeline, %topic, partition, low, high, "start = latest: positioned at the end");
                    a.position = Some(high);
                    self.pin
                        .lock()
                        .expect("positions to pin")
                        .push((a.tp.clone(), high));
                }
                Err(e) => {
                    // The pipeline keeps the offset of the first record it reads as where
                    // this partition started, for a rewind before its first commit.
                    tracing::warn!(pipeline = %self.pipeline, %topic, partition, error = %e, "cannot read the end of the partition: starting at the end as librdkafka sees it (the first record read marks where reading started)")
                }
            }
        }
    }

    /// Partitions positioned at a stored offset past the end of their log: the log
    /// restarted below what the tables store (a recreated topic, an unclean leader
    /// election). Brokers differ in what a fetch there does (an out-of-range reset to
    /// the oldest record, or waiting for the log to reach the offset), so the ends are
    /// asked for directly, in one request per broker.
    fn restarted_below(
        &self,
        consumer: &BaseConsumer<Self>,
        assigned: &[super::Assignment],
    ) -> Vec<SourceEvent> {
        let stored: Vec<&super::Assignment> = assigned
            .iter()
            .filter(|a| a.position.is_some() && a.stored.iter().any(Option::is_some))
            .collect();
        if stored.is_empty() {
            return Vec::new();
        }
        let mut tpl = TopicPartitionList::new();
        for a in &stored {
            let _ = tpl.add_partition_offset(&a.tp.0, a.tp.1, Offset::End);
        }
        let ends = match consumer.offsets_for_times(tpl, Duration::from_secs(10)) {
            Ok(ends) => ends,
            Err(e) => {
                tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot read the ends of the assigned partitions to check for a restarted log");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for a in stored {
            let (Some(position), Some(e)) = (a.position, ends.find_partition(&a.tp.0, a.tp.1))
            else {
                continue;
            };
            let Offset::Offset(end) = e.offset() else {
                continue;
            };
            if end < position {
                let (topic, partition) = (&a.tp.0, a.tp.1);
                tracing::error!(pipeline = %self.pipeline, %topic, partition, stored = position, end, "the partition's log ends below the offset stored in the table (topic recreated? unclean leader election?): records below the stored offset are skipped");
                // Counted once: the first record's check would report it again.
                self.positioned.take(topic, partition);
                out.push(SourceEvent::Reset {
                    tp: a.tp.clone(),
                    expected: position,
                    found: end,
                });
            }
        }
        out
    }

    fn offset_for(&self, position: Option<i64>) -> Offset {
        match (position, self.start) {
            (Some(o), _) => Offset::Offset(o),
            (None, StartPosition::Earliest) => Offset::Beginning,
            (None, StartPosition::Latest) => Offset::End,
        }
    }

    fn push(&self, event: SourceEvent) {
        self.pending
            .lock()
            .expect("pending events")
            .push_back(event);
    }
}

impl ConsumerContext for Context {
    // Never waits for the pipeline; reads positions from the tables (bounded time).
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let tps: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::<str>::from(e.topic()), e.partition()))
            .collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut assigned = self.lookup.lookup(&tps);
                if self.start == StartPosition::Latest {
                    self.position_latest(consumer, &mut assigned);
                }
                for a in &assigned {
                    let (topic, partition) = &a.tp;
                    if let Err(e) =
                        tpl.set_partition_offset(topic, *partition, self.offset_for(a.position))
                    {
                        tracing::error!(pipeline = %self.pipeline, %topic, partition, error = %e, "cannot set start offset");
                    }
                    if let Some(o) = a.position {
                        self.positioned.insert(a.tp.clone(), o);
                    }
                }
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = result {
                    self.push(SourceEvent::Failed(format!("assign failed: {e}")));
                    return;
                }
                if self.paused.load(Ordering::SeqCst) {
                    // The pipeline is behind: partitions assigned meanwhile wait too, so
                    // nothing piles up in memory while it cannot take records.
                    if let Err(e) = consumer.pause(tpl) {
                        tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot pause newly assigned partitions");
                    }
                }
                tracing::info!(pipeline = %self.pipeline, partitions = assigned.len(), cooperative, "partitions assigned");
                crate::telemetry::rebalanced(&self.pipeline, "assigned");
                let restarted = self.restarted_below(consumer, &assigned);
                self.push(SourceEvent::Assigned(assigned));
                for event in restarted {
                    self.push(event);
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let lost = consumer.assignment_lost();
                tracing::info!(pipeline = %self.pipeline, partitions = tps.len(), lost, "partitions revoked");
                crate::telemetry::rebalanced(&self.pipeline, "revoked");
                self.push(SourceEvent::Revoked(tps));
                let result = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = result {
                    tracing::warn!(pipeline = %self.pipeline, error = %e, "unassign failed");
                }
            }
            other => {
                tracing::error!(pipeline = %self.pipeline, error = ?other, "rebalance error");
                let all = consumer
                    .assignment()
                    .map(|a| {
                        a.elements()
                            .iter()
                            .map(|e| (Arc::<str>::from(e.topic()), e.partition()))
                            .collect()
                    })
                    .unwrap_or_default();
                self.push(SourceEvent::Revoked(all));
                let _ = consumer.unassign();
            }
        }
    }
}

/// Handle to a running consumer thread.
pub struct KafkaSource {
    events: Receiver<SourceEvent>,
    commands: Sender<SourceCommand>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pending: Pending,
}

impl KafkaSource {
    /// Records polled but not yet handed to the pipeline (bounded while it is behind).
    pub fn queued_records(&self) -> usize {
        self.pending
            .lock()
            .expect("pending events")
            .iter()
            .map(|e| match e {
                SourceEvent::Records(_, m) => m.len(),
                _ => 0,
            })
            .sum()
    }
}

impl KafkaSource {
    /// Checks the brokers and topics, subscribes and starts the consumer thread.
    pub fn start(
        pipeline: &str,
        config: &SourceConfig,
        lookup: Arc<dyn PositionLookup>,
    ) -> Result<KafkaSource, SourceError> {
        let (tx, rx) = crossbeam_channel::bounded(EVENT_QUEUE);
        let pending: Pending = Arc::default();
        let positioned: Arc<Positioned> = Arc::default();
        let pin: Arc<Mutex<Vec<(TopicPartition, i64)>>> = Arc::default();
        let paused: Arc<AtomicBool> = Arc::default();
        let context = Context {
            pipeline: pipeline.to_string(),
            start: config.start,
            lookup,
            pending: pending.clone(),
            positioned: positioned.clone(),
            pin: pin.clone(),
            paused: paused.clone(),
            tokens: super::oauth::ContextTokens::new(config.token_source()),
            client_errors: ClientErrors::default(),
        };
        let consumer: BaseConsumer<Context> =
            config.client_config().create_with_context(context)?;
        consumer
            .context()
            .tokens
            .serve_first(Duration::from_secs(15), || {
                let _ = consumer.poll(Duration::from_millis(100));
            });
        let metadata = match consumer.fetch_metadata(None, Duration::from_secs(15)) {
            Ok(metadata) => metadata,
            Err(source) => {
                let recorded = || {
                    pending
                        .lock()
                        .expect("pending events")
                        .iter()
                        .find_map(|e| match e {
                            SourceEvent::Failed(reason) => Some(reason.clone()),
                            _ => None,
                        })
                };
                return Err(match super::why_refused(&consumer, recorded) {
                    Some(reason) => SourceError::Refused(reason),
                    None => SourceError::Unreachable {
                        servers: config.bootstrap_servers.clone(),
                        source,
                    },
                });
            }
        };
        for topic in &config.topics {
            let found = metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
            if !found {
                return Err(SourceError::MissingTopic(topic.clone()));
            }
        }
        match &config.topic_pattern {
            // librdkafka treats a subscription starting with '^' as a regex.
            Some(p) => consumer.subscribe(&[&format!("^{}", p.trim_start_matches('^'))])?,
            None => {
                consumer.subscribe(&config.topics.iter().map(String::as_str).collect::<Vec<_>>())?
            }
        }
        // The group's first assignment can take a session timeout or more (another
        // member must leave or join first): say what is awaited.
        tracing::info!(pipeline = %pipeline, group = %config.group_id, brokers = metadata.brokers().len(), "joining the consumer group; partitions are assigned once the group settles");
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let mut poller = Poller {
            pipeline: pipeline.to_string(),
            consumer,
            events: tx,
            commands: cmd_rx,
            stop: stop.clone(),
            start: config.start,
            pending: pending.clone(),
            positioned,
            pin,
            epoch: 0,
            topics: Default::default(),
            paused,
            last_batch: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("floe-source-{pipeline}"))
            .spawn(move || poller.run())
            .map_err(|e| SourceError::Stopped(e.to_string()))?;
        Ok(KafkaSource {
            events: rx,
            commands: cmd_tx,
            stop,
            thread: Some(thread),
            pending,
        })
    }
}

impl Source for KafkaSource {
    fn events(&self) -> &Receiver<SourceEvent> {
        &self.events
    }

    fn command(&self, command: SourceCommand) {
        let _ = self.commands.send(command);
    }

    fn shutdown(mut self: Box<Self>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Topic names shared as `Arc<str>`, so a message does not allocate its topic.
#[derive(Default)]
struct TopicNames {
    last: Option<Arc<str>>,
    all: HashSet<Arc<str>>,
}

impl TopicNames {
    fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(last) = &self.last
            && **last == *name
        {
            return last.clone();
        }
        let shared = match self.all.get(name) {
            Some(known) => known.clone(),
            None => {
                let new: Arc<str> = Arc::from(name);
                self.all.insert(new.clone());
                new
            }
        };
        self.last = Some(shared.clone());
        shared
    }
}

struct Poller {
    pipeline: String,
    consumer: BaseConsumer<Context>,
    events: Sender<SourceEvent>,
    commands: Receiver<SourceCommand>,
    stop: Arc<AtomicBool>,
    start: StartPosition,
    pending: Pending,
    positioned: Arc<Positioned>,
    /// `start = "latest"` positions the rebalance callback chose, to commit to the group.
    pin: Arc<Mutex<Vec<(TopicPartition, i64)>>>,
    epoch: u64,
    /// Topic names as the pipeline shares them; `last` is the one of the previous
    /// message (consecutive messages almost always share it).
    topics: std::cell::RefCell<TopicNames>,
    /// Whether the partitions are paused (shared with the rebalance callback).
    paused: Arc<AtomicBool>,
    /// Messages in the previous batch.
    last_batch: usize,
}

impl Poller {
    fn run(&mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            while let Ok(cmd) = self.commands.try_recv() {
                self.run_command(cmd);
            }
            self.commit_pinned();
            if !self.deliver() {
                break;
            }
            if self.paused.load(Ordering::SeqCst) {
                // Serve the group (rebalances, liveness) without taking more records; a
                // record librdkafka still hands out (fetched before the pause) is kept, in
                // order, never dropped, and its partition is paused again.
                if let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(50)) {
                    let message = self.message(&m);
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&message.topic, message.partition);
                    let _ = self.consumer.pause(&tpl);
                    self.queue(SourceEvent::Records(self.epoch, vec![message]));
                }
                continue;
            }
            let polled = std::time::Instant::now();
            let batch = self.poll_batch();
            if polled.elapsed() > Duration::from_millis(200) {
                tracing::debug!(pipeline = %self.pipeline, ms = polled.elapsed().as_millis() as u64, records = batch.len(), "slow poll");
            }
            if !batch.is_empty() {
                self.queue(SourceEvent::Records(self.epoch, batch));
            }
        }
        // A failure queued just before stopping still reaches the pipeline.
        while let Some(event) = self.pending.lock().expect("pending events").pop_front() {
            if matches!(event, SourceEvent::Failed(_))
                && self
                    .events
                    .send_timeout(event, Duration::from_secs(5))
                    .is_err()
            {
                break;
            }
        }
        self.consumer.unsubscribe();
    }

    fn queue(&self, event: SourceEvent) {
        self.pending
            .lock()
            .expect("pending events")
            .push_back(event);
    }

    /// Moves queued events to the pipeline without blocking; pauses the partitions while
    /// the pipeline is behind. Returns false once the pipeline is gone.
    fn deliver(&mut self) -> bool {
        loop {
            let Some(event) = self.pending.lock().expect("pending events").pop_front() else {
                break;
            };
            // A short wait is cheaper than pausing: a paused partition drops what
            // librdkafka prefetched and fetches it again on resume. Only a long stall
            // pauses (and then this thread keeps polling to serve the group).
            let event = match self.events.try_send(event) {
                Ok(()) => continue,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(event)) if self.paused.load(Ordering::SeqCst) => event,
                Err(TrySendError::Full(event)) => {
                    tracing::trace!(pipeline = %self.pipeline, "pipeline behind: waiting for room");
                    match self.events.send_timeout(event, SHORT_STALL) {
                        Ok(()) => continue,
                        Err(SendTimeoutError::Disconnected(_)) => return false,
                        Err(SendTimeoutError::Timeout(event)) => event,
                    }
                }
            };
            self.pending
                .lock()
                .expect("pending events")
                .push_front(event);
            self.set_paused(true);
            return true;
        }
        self.set_paused(false);
        true
    }

    fn set_paused(&mut self, paused: bool) {
        if self.paused.load(Ordering::SeqCst) == paused {
            return;
        }
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        let result = if paused {
            self.consumer.pause(&assignment)
        } else {
            self.consumer.resume(&assignment)
        };
        match result {
            Ok(()) => {
                self.paused.store(paused, Ordering::SeqCst);
                tracing::debug!(pipeline = %self.pipeline, paused, "backpressure");
            }
            Err(e) => tracing::warn!(pipeline = %self.pipeline, error = %e, "pause/resume failed"),
        }
    }

    /// Commits the `start = "latest"` positions chosen at assignment to the group.
    fn commit_pinned(&mut self) {
        let pinned = std::mem::take(&mut *self.pin.lock().expect("positions to pin"));
        if pinned.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &pinned {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
            tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot record the start = latest positions in the group; a restart before the first commit starts at the end again");
        }
    }

    fn poll_batch(&mut self) -> Vec<Message> {
        // Sized like the previous batch: growing a vector of thousands of messages
        // step by step copies each of them about twice more.
        let mut batch = Vec::with_capacity(self.last_batch);
        let mut timeout = Duration::from_millis(100);
        let mut bytes = 0;
        while batch.len() < MAX_EVENT_RECORDS && bytes < MAX_EVENT_BYTES {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Ok(m)) => {
                    let message = self.message(&m);
                    bytes += message.key.as_ref().map_or(0, Vec::len)
                        + message.value.as_ref().map_or(0, Vec::len)
                        + message.header_bytes();
                    batch.push(message);
                }
                Some(Err(e)) => {
                    if is_fatal(&e) {
                        let message = match super::security_failure(&e) {
                            Some(what) => format!("{what} ({e})"),
                            None => e.to_string(),
                        };
                        self.queue(SourceEvent::Failed(message));
                        self.stop.store(true, Ordering::SeqCst);
                        break;
                    }
                    tracing::warn!(pipeline = %self.pipeline, error = %e, "Kafka consumer error (librdkafka retries)");
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        self.last_batch = batch.len();
        batch
    }

    /// Copies a message out of librdkafka (checking for a retention gap first).
    fn message(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> Message {
        let topic = self.topics.borrow_mut().get(m.topic());
        let message = Message {
            topic,
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        };
        self.check_gap(&message);
        message
    }

    /// The first record after positioning a partition: if it is past the position and
    /// the log now starts past it too, retention removed records we never read; if it
    /// is before the position, the log restarted below it.
    fn check_gap(&self, m: &Message) {
        let Some(expected) = self.positioned.take(&m.topic, m.partition) else {
            return;
        };
        let tp = m.topic_partition();
        if m.offset < expected {
            // A consumer positioned at `expected` never gets an earlier offset unless the
            // position was out of range and reset: the log restarted below what the
            // table stores (a recreated topic, an unclean leader election).
            tracing::error!(pipeline = %self.pipeline, topic = %m.topic, partition = m.partition, stored = expected, found = m.offset, "the partition's log restarted below the offset stored in the table (topic recreated? unclean leader election?): records below the stored offset are skipped");
            self.queue(SourceEvent::Reset {
                tp,
                expected,
                found: m.offset,
            });
            return;
        }
        if m.offset == expected {
            return;
        }
        // Offsets also jump over transaction markers: only the log start is proof.
        let low = self
            .consumer
            .fetch_watermarks(&m.topic, m.partition, Duration::from_secs(10))
            .map(|(low, _)| low);
        match low {
            Ok(low) if low > expected => {
                tracing::error!(pipeline = %self.pipeline, topic = %m.topic, partition = m.partition, expected, found = m.offset, lost = m.offset - expected, "records were removed from Kafka before they were read (retention or DeleteRecords): resuming at the oldest record");
                self.queue(SourceEvent::Gap {
                    tp,
                    expected,
                    found: m.offset,
                });
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot read the log start to check for a gap")
            }
        }
    }

    fn run_command(&mut self, cmd: SourceCommand) {
        match cmd {
            SourceCommand::Seek { epoch, positions } => {
                self.epoch = epoch;
                let assigned: std::collections::HashSet<(String, i32)> = self
                    .consumer
                    .assignment()
                    .map(|a| {
                        a.elements()
                            .iter()
                            .map(|e| (e.topic().to_string(), e.partition()))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut tpl = TopicPartitionList::new();
                for ((topic, partition), offset) in &positions {
                    if !assigned.contains(&(topic.to_string(), *partition)) {
                        continue;
                    }
                    let to = match (offset, self.start) {
                        (Some(o), _) => Offset::Offset(*o),
                        (None, StartPosition::Earliest) => Offset::Beginning,
                        (None, StartPosition::Latest) => Offset::End,
                    };
                    let _ = tpl.add_partition_offset(topic, *partition, to);
                    if let Some(o) = offset {
                        self.positioned.insert((topic.clone(), *partition), *o);
                    }
                }
                if tpl.count() == 0 {
                    return;
                }
                // Records already fetched before the seek carry the old epoch and are dropped.
                match self.consumer.seek_partitions(tpl, Duration::from_secs(10)) {
                    Ok(result) => {
                        for e in result.elements() {
                            if let Err(err) = e.error() {
                                self.seek_failed(format!("{}/{}: {err}", e.topic(), e.partition()));
                            }
                        }
                    }
                    Err(e) => self.seek_failed(e.to_string()),
                }
            }
            SourceCommand::CommitGroupOffsets(list) => {
                let mut tpl = TopicPartitionList::new();
                for ((topic, partition), offset) in &list {
                    let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
                }
                if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                    tracing::debug!(pipeline = %self.pipeline, error = %e, "group offset commit failed (monitoring only)");
                }
            }
        }
    }

    /// A seek that did not happen would let reading continue past records the pipeline
    /// dropped: stop instead (the pipeline restarts from the tables).
    fn seek_failed(&mut self, reason: String) {
        tracing::error!(pipeline = %self.pipeline, %reason, "seek failed after a rewind");
        self.queue(SourceEvent::Failed(format!("seek failed: {reason}")));
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_positioned_partition_is_checked_once() {
        let positioned = Positioned::default();
        let topic: Arc<str> = Arc::from("events");
        assert_eq!(positioned.take(&topic, 0), None);
        positioned.insert((topic.clone(), 0), 41);
        positioned.insert((topic.clone(), 1), 7);
        assert_eq!(positioned.take(&topic, 2), None);
        assert_eq!(positioned.take(&topic, 0), Some(41));
        assert_eq!(
            positioned.take(&topic, 0),
            None,
            "only the first record checks"
        );
        // Positioned again (a seek after a rewind): checked again.
        positioned.insert((topic.clone(), 0), 50);
        assert_eq!(positioned.take(&topic, 0), Some(50));
        assert_eq!(positioned.take(&topic, 1), Some(7));
        assert!(
            !positioned.any.load(Ordering::Acquire),
            "nothing left to check"
        );
    }

    #[test]
    fn topic_names_are_shared_and_never_mixed_up() {
        let mut names = TopicNames::default();
        let a = names.get("orders");
        let b = names.get("payments");
        assert_eq!(&*a, "orders");
        assert_eq!(&*b, "payments");
        assert!(Arc::ptr_eq(&names.get("orders"), &a));
        assert!(Arc::ptr_eq(&names.get("orders"), &a), "the last name again");
        assert!(Arc::ptr_eq(&names.get("payments"), &b));
        assert_eq!(names.all.len(), 2);
    }
}
