//! A pipeline's plugins, run in order over batches of records.
//!
//! Each stage gets the records the previous one produced, in calls of at most
//! `limits.batch` records and `limits.batch_bytes` bytes (one buffer in, one buffer
//! out per call). Answers are applied to the agent's own parsed objects: an unchanged
//! record goes on as it is, a patch is applied with [`JsonView::apply_borrowed`] (a `null`
//! parent on a `set` path becomes an object, as the SDK documents), new objects are
//! parsed once. A call that faults is split and retried on a fresh instance until
//! the record behind the fault is alone; that record becomes a [`RecordError`] with
//! the fault as its message and the rest goes on.
//!
//! A chain may run on several threads ("lanes", `transform_threads`): each lane holds
//! its own instance of every plugin and takes a contiguous share of the batch, so
//! plugins use the cores that decoding and Parquet encoding leave idle. Outputs and
//! errors are merged back in input order, so the result does not depend on the number
//! of lanes (only on which records share a call: seeds and fault isolation are per
//! call, as before).
//!
//! WebAssembly never runs on a tokio worker: called from inside a runtime, `run`
//! runs its calls on a thread of its own for the duration of the call (WASI's
//! blocking host calls would otherwise panic with "Cannot start a runtime from within
//! a runtime"). The chain's lanes run on threads of its own.
//!
//! The pipeline's intake calls `run_parts`: the batch is cut into parts of a few
//! hundred records that the lanes take in turn, and each part's result comes back to
//! the intake in order as soon as it is ready, so the intake admits and buffers one
//! part's records while the plugins run the next ones.

use std::hash::{Hash as _, Hasher as _};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use floe_sdk::wire::{self, AnswerReader, InputWriter};

use super::engine::TransformEngine;
use super::plugin::{CallError, FaultKind, PluginInstance};
use super::sandbox::sanitize;
use super::{Limits, OnError, TransformConfig, TransformError};
use smallvec::SmallVec;

use crate::record::json::{INLINE_OPS, JsonError, JsonObject, JsonView, PatchRef};
use crate::telemetry;

/// Bytes of a plugin's record error message kept.
const MESSAGE_BYTES: usize = 4096;

/// One record going into the chain.
#[derive(Debug, Clone, Copy)]
pub struct ChainInput<'a> {
    /// The value, parsed once by the pipeline.
    pub value: JsonView<'a>,
    /// Topic the message was read from.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Message timestamp in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// Message key bytes (decoded to text when the key format says so).
    pub key: Option<&'a [u8]>,
}

/// What an output holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Produced {
    /// The input's own value, unchanged by every plugin: reuse what was parsed.
    Unchanged,
    /// A new object (patched or emitted by a plugin).
    New(JsonObject),
}

/// One record coming out of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainOutput {
    /// Index of the input record it came from.
    pub origin: usize,
    /// Its value.
    pub value: Produced,
    /// Output stream; `None` is the pipeline's default table.
    pub route: Option<String>,
}

/// A record a plugin returned an error for, or whose fault was isolated to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// Index of the input record it came from.
    pub origin: usize,
    /// The plugin.
    pub plugin: String,
    /// What the plugin said, or the fault (`panicked: ...`, `exceeded its fuel limit ...`).
    pub message: String,
    /// The plugin's policy for it.
    pub policy: OnError,
}

/// What a batch produced, in input order.
#[derive(Debug, Default)]
pub struct ChainResult {
    /// Outputs of the last plugin.
    pub outputs: Vec<ChainOutput>,
    /// Record errors, by plugin policy.
    pub errors: Vec<RecordError>,
}

/// A record between two stages.
struct Item {
    origin: usize,
    /// `None`: still the input's own value.
    value: Option<JsonObject>,
    route: Option<String>,
}

impl Item {
    /// Gives the buffers of the value this stage replaced or dropped to the next
    /// patch written on this thread.
    fn recycle(&mut self) {
        if let Some(value) = self.value.take() {
            value.recycle();
        }
    }
}

/// What one answer turned into.
enum Out {
    Keep(Option<String>),
    Drop,
    /// A patched record (one output: no vector for it).
    Patched(JsonObject, Option<String>),
    New(Vec<(JsonObject, Option<String>)>),
    Error(String),
}

struct Stage {
    instance: PluginInstance,
    name: String,
    on_error: OnError,
    limits: Limits,
    /// The input buffer, reused across calls.
    buf: Vec<u8>,
    /// Records in a row that faulted alone.
    alone_in_a_row: u32,
}

/// Records a lane gets at least before a batch is shared with another lane (a thread
/// start costs tens of microseconds, a record a fraction of one).
const MIN_RECORDS_PER_LANE: usize = 256;

/// Records per part in [`TransformChain::run_parts`]: small enough that a 4,096-record
/// batch makes several parts to overlap, large enough that a call's fixed cost (a few
/// microseconds) stays small beside its records'.
const PART_RECORDS: usize = 512;

/// The plugins of one pipeline.
pub struct TransformChain {
    pipeline: String,
    /// One instance of every plugin per lane.
    lanes: Vec<Vec<Stage>>,
    /// One thread per lane (kept for the chain's life: a thread started per batch
    /// costs a fresh stack each time). `run` runs lane 0 on the caller's thread;
    /// `run_parts` runs every lane here.
    pool: Option<Arc<rayon::ThreadPool>>,
    max_consecutive_faults: u32,
}

impl Default for TransformChain {
    fn default() -> Self {
        TransformChain::empty()
    }
}

/// Runs `f` where WebAssembly may run: on this thread, unless it is inside a tokio
/// runtime, then on a short-lived thread of its own.
pub(crate) fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("floe-plugins".into())
            .stack_size(8 << 20)
            .spawn_scoped(s, f)
            .expect("cannot start a thread for plugin calls");
        match thread.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

impl TransformChain {
    /// The empty chain: records pass unchanged.
    pub fn empty() -> Self {
        TransformChain {
            pipeline: String::new(),
            lanes: Vec::new(),
            pool: None,
            max_consecutive_faults: 3,
        }
    }

    /// Loads and initialises every plugin of a pipeline (each `init` gets its `with`
    /// table), on one lane.
    pub fn new(
        pipeline: &str,
        engine: &TransformEngine,
        configs: &[TransformConfig],
    ) -> Result<TransformChain, TransformError> {
        TransformChain::with_lanes(pipeline, engine, configs, 1)
    }

    /// Like [`TransformChain::new`], with `lanes` instances of every plugin so that a
    /// large batch runs on up to `lanes` threads (at least one).
    pub fn with_lanes(
        pipeline: &str,
        engine: &TransformEngine,
        configs: &[TransformConfig],
        lanes: usize,
    ) -> Result<TransformChain, TransformError> {
        if configs.is_empty() {
            return Ok(TransformChain::empty());
        }
        let lanes = off_runtime(|| {
            let components = configs
                .iter()
                .map(|config| engine.load(config))
                .collect::<Result<Vec<_>, TransformError>>()?;
            (0..lanes.max(1))
                .map(|_| {
                    configs
                        .iter()
                        .zip(&components)
                        .map(|(config, component)| {
                            Ok(Stage {
                                instance: PluginInstance::new(engine, config, component.clone())?,
                                name: config.display_name(),
                                on_error: config.on_error,
                                limits: config.limits,
                                buf: Vec::new(),
                                alone_in_a_row: 0,
                            })
                        })
                        .collect::<Result<Vec<Stage>, TransformError>>()
                })
                .collect::<Result<Vec<Vec<Stage>>, TransformError>>()
        })?;
        let name = pipeline.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(lanes.len())
            .stack_size(8 << 20)
            .thread_name(move |i| format!("floe-plugins-{name}-{i}"))
            .build()
            .map_err(|e| TransformError::Engine(format!("cannot start plugin threads: {e}")))?;
        Ok(TransformChain {
            pipeline: pipeline.to_string(),
            lanes,
            pool: Some(Arc::new(pool)),
            max_consecutive_faults: 3,
        })
    }

    /// Sets how many records in a row may fault alone (each is handed to `on_error`)
    /// before the plugin counts as broken and [`TransformChain::run`] fails with its
    /// fault (default 3).
    pub fn with_max_consecutive_faults(mut self, n: u32) -> Self {
        self.max_consecutive_faults = n.max(1);
        self
    }

    /// Whether there are no plugins.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// The plugins' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.lanes
            .first()
            .map(|stages| stages.iter().map(|s| s.instance.name()).collect())
            .unwrap_or_default()
    }

    /// Fuel (about one unit per WebAssembly instruction) every instance of the chain's
    /// plugins used so far, when the engine counts fuel (`limits.fuel` set on a
    /// plugin); 0 otherwise. Unlike time, it does not move with the machine's load:
    /// `floe-plugin-bench --fuel` reports it per record.
    pub fn fuel_used(&self) -> u64 {
        self.lanes
            .iter()
            .flatten()
            .map(|stage| stage.instance.fuel_used())
            .sum()
    }

    /// A handle that frees records the plugins produced on the plugins' threads.
    pub fn releaser(&self) -> Releaser {
        Releaser(self.pool.clone())
    }

    /// How many threads a large batch may run on.
    pub fn lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    /// Runs records through every plugin. Outputs and errors come in input order.
    ///
    /// Errors: [`TransformError::Fault`] when a plugin faults on
    /// `max_consecutive_faults` records in a row or cannot be rebuilt,
    /// [`TransformError::Interrupted`] after [`TransformEngine::stop`]. Nothing of the
    /// batch should be committed then.
    pub fn run(&mut self, inputs: &[ChainInput<'_>]) -> Result<ChainResult, TransformError> {
        if self.lanes.is_empty() || inputs.is_empty() {
            return Ok(unchanged(inputs.len()));
        }
        off_runtime(|| self.run_blocking(inputs))
    }

    /// [`TransformChain::run`] on a thread that may block (never a tokio worker).
    fn run_blocking(&mut self, inputs: &[ChainInput<'_>]) -> Result<ChainResult, TransformError> {
        if self.lanes.is_empty() || inputs.is_empty() {
            return Ok(unchanged(inputs.len()));
        }
        let lanes = self
            .lanes
            .len()
            .min(inputs.len() / MIN_RECORDS_PER_LANE)
            .max(1);
        let pipeline = self.pipeline.as_str();
        let max_faults = self.max_consecutive_faults;
        let (Some(pool), true) = (&self.pool, lanes > 1) else {
            return run_lane(pipeline, max_faults, &mut self.lanes[0], inputs);
        };
        // Contiguous shares, so that merging keeps the input order.
        let share = inputs.len().div_ceil(lanes);
        let mut results: Vec<Option<Result<ChainResult, TransformError>>> =
            (0..lanes).map(|_| None).collect();
        pool.in_place_scope(|s| {
            let mut shares = self
                .lanes
                .iter_mut()
                .zip(inputs.chunks(share))
                .zip(results.iter_mut());
            let ((first, first_inputs), first_slot) = shares.next().expect("at least two lanes");
            for ((stages, part), slot) in shares {
                s.spawn(move |_| *slot = Some(run_lane(pipeline, max_faults, stages, part)));
            }
            *first_slot = Some(run_lane(pipeline, max_faults, first, first_inputs));
        });
        let mut merged = ChainResult::default();
        for (lane, result) in results.into_iter().enumerate() {
            let result = result.expect("every lane ran")?.shifted(lane * share);
            merged.outputs.extend(result.outputs);
            merged.errors.extend(result.errors);
        }
        Ok(merged)
    }

    /// Runs records through every plugin in parts of a few hundred records and hands
    /// each part's result to `each`, on the calling thread and in input order, while
    /// the lanes run the parts after it: what the caller does with a part's outputs
    /// (the pipeline admits and buffers them) overlaps the plugins' work on the next
    /// parts. Origins in every result index `inputs`. A part that fails (see
    /// [`TransformChain::run`]) is handed over as its error. `each` returns `false` to
    /// stop: the parts not handed over yet are dropped.
    ///
    /// For a caller that may block: a plain thread or a `tokio::task::spawn_blocking`
    /// thread (as the pipeline's intake), never a tokio worker. Which records
    /// share a call differs from `run` (calls stay within a part), so plugins that
    /// depend on the seed of a call may answer differently; nothing else does.
    pub fn run_parts(
        &mut self,
        inputs: &[ChainInput<'_>],
        mut each: impl FnMut(Result<ChainResult, TransformError>) -> bool,
    ) {
        if self.lanes.is_empty() || inputs.is_empty() {
            each(Ok(unchanged(inputs.len())));
            return;
        }
        let pipeline = self.pipeline.as_str();
        let max_faults = self.max_consecutive_faults;
        let parts: Vec<&[ChainInput<'_>]> = inputs.chunks(PART_RECORDS).collect();
        let (Some(pool), true) = (&self.pool, parts.len() > 1) else {
            each(run_lane(pipeline, max_faults, &mut self.lanes[0], inputs));
            return;
        };
        let lanes = self.lanes.len().min(parts.len());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (done, results) = std::sync::mpsc::channel();
        pool.in_place_scope(|s| {
            // Lane l runs parts l, l + lanes, ... one after the other.
            for (lane, stages) in self.lanes.iter_mut().take(lanes).enumerate() {
                let (done, stop, parts) = (done.clone(), &stop, &parts);
                s.spawn(move |_| {
                    for k in (lane..parts.len()).step_by(lanes) {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return;
                        }
                        let result = run_lane(pipeline, max_faults, stages, parts[k])
                            .map(|r| r.shifted(k * PART_RECORDS));
                        if done.send((k, result)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(done);
            let mut ready: Vec<Option<Result<ChainResult, TransformError>>> =
                (0..parts.len()).map(|_| None).collect();
            let mut next = 0;
            while next < parts.len() {
                let Ok((k, result)) = results.recv() else {
                    return;
                };
                ready[k] = Some(result);
                while let Some(result) = ready.get_mut(next).and_then(Option::take) {
                    next += 1;
                    if !each(result) {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                }
            }
        });
    }
}

/// Frees records made by the plugins' threads on those threads (see
/// [`TransformChain::releaser`]).
#[derive(Clone, Default)]
pub struct Releaser(Option<Arc<rayon::ThreadPool>>);

impl Releaser {
    /// Frees `values` on a plugin thread, or here for a chain without threads. The
    /// records a plugin changed were allocated on its thread. Freeing them there keeps
    /// that work (glibc's cross-thread `free`) off the pipeline thread, which is the
    /// chain's bottleneck, and lets the plugin thread reuse their buffers for the next
    /// records it patches ([`JsonObject::recycle`]).
    pub fn release(&self, values: Vec<JsonObject>) {
        match &self.0 {
            Some(pool) if !values.is_empty() => {
                pool.spawn(move || values.into_iter().for_each(JsonObject::recycle))
            }
            _ => drop(values),
        }
    }
}

impl ChainResult {
    /// The result with every origin moved up by `base` (a part's result as the
    /// whole batch's).
    fn shifted(mut self, base: usize) -> ChainResult {
        for o in &mut self.outputs {
            o.origin += base;
        }
        for e in &mut self.errors {
            e.origin += base;
        }
        self
    }
}

/// What a chain without plugins gives: every input unchanged.
fn unchanged(records: usize) -> ChainResult {
    ChainResult {
        outputs: (0..records)
            .map(|origin| ChainOutput {
                origin,
                value: Produced::Unchanged,
                route: None,
            })
            .collect(),
        errors: Vec::new(),
    }
}

/// Runs records through one lane's instances of every plugin.
fn run_lane(
    pipeline: &str,
    max_faults: u32,
    stages: &mut [Stage],
    inputs: &[ChainInput<'_>],
) -> Result<ChainResult, TransformError> {
    let mut items: Vec<Item> = (0..inputs.len())
        .map(|origin| Item {
            origin,
            value: None,
            route: None,
        })
        .collect();
    let mut errors = Vec::new();
    for stage in stages.iter_mut() {
        let started = Instant::now();
        let records_in = items.len();
        let mut next = Vec::with_capacity(items.len());
        let mut start = 0;
        while start < items.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < items.len() && end - start < stage.limits.batch.max(1) {
                let len = value_of(inputs, &items[end]).bytes().len() as u64;
                if end > start && bytes + len > stage.limits.batch_bytes {
                    break;
                }
                bytes += len;
                end += 1;
            }
            stage.run_range(
                pipeline,
                max_faults,
                inputs,
                &mut items,
                start..end,
                &mut next,
                &mut errors,
            )?;
            start = end;
        }
        stage.metrics(pipeline, records_in, next.len(), started);
        items = next;
    }
    errors.sort_by_key(|e| e.origin);
    Ok(ChainResult {
        outputs: items
            .into_iter()
            .map(|item| ChainOutput {
                origin: item.origin,
                value: match item.value {
                    None => Produced::Unchanged,
                    Some(v) => Produced::New(v),
                },
                route: item.route,
            })
            .collect(),
        errors,
    })
}

fn value_of<'a>(inputs: &'a [ChainInput<'_>], item: &'a Item) -> JsonView<'a> {
    item.value
        .as_ref()
        .map_or(inputs[item.origin].value, JsonObject::view)
}

impl Stage {
    /// Runs `items[range]` through the plugin, splitting the range on a fault.
    #[allow(
        clippy::too_many_arguments,
        reason = "the state of one stage of one batch"
    )]
    fn run_range(
        &mut self,
        pipeline: &str,
        max_faults: u32,
        inputs: &[ChainInput<'_>],
        items: &mut [Item],
        range: Range<usize>,
        next: &mut Vec<Item>,
        errors: &mut Vec<RecordError>,
    ) -> Result<(), TransformError> {
        match self.call(inputs, &items[range.clone()]) {
            Ok(outs) => {
                self.alone_in_a_row = 0;
                for (item, out) in items[range].iter_mut().zip(outs) {
                    let inherited = || item.route.clone();
                    match out {
                        Out::Keep(route) => next.push(Item {
                            origin: item.origin,
                            route: route.or_else(inherited),
                            value: item.value.take(),
                        }),
                        Out::Drop => item.recycle(),
                        Out::Patched(v, route) => {
                            let route = route.or_else(inherited);
                            item.recycle();
                            next.push(Item {
                                origin: item.origin,
                                value: Some(v),
                                route,
                            })
                        }
                        Out::New(values) => {
                            let route = item.route.take();
                            item.recycle();
                            next.extend(values.into_iter().map(|(v, r)| Item {
                                origin: item.origin,
                                value: Some(v),
                                route: r.or_else(|| route.clone()),
                            }))
                        }
                        Out::Error(message) => errors.push(RecordError {
                            origin: item.origin,
                            plugin: self.name.clone(),
                            message,
                            policy: self.on_error,
                        }),
                    }
                }
                Ok(())
            }
            Err(CallError::Interrupted) => Err(TransformError::Interrupted {
                plugin: self.name.clone(),
            }),
            Err(CallError::Fatal(e)) => Err(e),
            Err(CallError::Fault(fault)) => {
                telemetry::plugin_fault(pipeline, &self.name);
                if range.len() == 1 {
                    self.alone_in_a_row += 1;
                    let input = &inputs[items[range.start].origin];
                    if self.alone_in_a_row >= max_faults {
                        tracing::error!(pipeline, plugin = %self.name, %fault, records = self.alone_in_a_row, "plugin faulted on records in a row, each alone: the plugin is broken");
                        return Err(TransformError::Fault(fault));
                    }
                    tracing::warn!(pipeline, plugin = %self.name, %fault, topic = input.topic, partition = input.partition, offset = input.offset, "plugin fault isolated to one record; it goes to on_error");
                    errors.push(RecordError {
                        origin: items[range.start].origin,
                        plugin: self.name.clone(),
                        message: fault.reason(),
                        policy: self.on_error,
                    });
                    return Ok(());
                }
                tracing::info!(pipeline, plugin = %self.name, %fault, records = range.len(), "plugin fault in a batch: retrying it in parts to find the record");
                for part in split(range, fault.index) {
                    self.run_range(pipeline, max_faults, inputs, items, part, next, errors)?;
                }
                Ok(())
            }
        }
    }

    /// One call over `items`: encode, run, decode.
    fn call(&mut self, inputs: &[ChainInput<'_>], items: &[Item]) -> Result<Vec<Out>, CallError> {
        let (topics, topic_of) = topic_table(items.iter().map(|i| inputs[i.origin].topic));
        let mut buf = std::mem::take(&mut self.buf);
        // Plugins of contract 0.2.2 get each record's field index (read off the tape as
        // it is written); earlier ones the layout they were built for.
        let mut writer = match self.instance.indexed() {
            true => InputWriter::indexed(&mut buf, items.len(), &topics),
            false => InputWriter::new(&mut buf, items.len(), &topics),
        };
        for (item, &topic) in items.iter().zip(&topic_of) {
            let input = &inputs[item.origin];
            let value = value_of(inputs, item);
            writer.push(
                value.bytes(),
                input.key,
                topic,
                input.partition,
                input.offset,
                input.timestamp_ms,
                Some(value.field_spans()),
            );
        }
        let first = &inputs[items[0].origin];
        let mut seed = std::collections::hash_map::DefaultHasher::new();
        (&self.name, first.topic, first.partition, first.offset).hash(&mut seed);
        let max_outputs = self.limits.max_outputs;
        let result = self.instance.call(&buf, seed.finish(), |answers| {
            decode(answers, inputs, items, max_outputs)
        });
        self.buf = buf;
        result
    }

    fn metrics(&self, pipeline: &str, records_in: usize, records_out: usize, started: Instant) {
        telemetry::plugin_batch(
            pipeline,
            &self.name,
            records_in,
            records_out,
            started.elapsed(),
        );
    }
}

/// The call's topic table (each topic once, in order of first use) and each record's
/// index into it. A batch's records are nearly always of one topic: the last one
/// found is tried first, and names are compared without `memcmp`.
fn topic_table<'a>(
    topics_of_records: impl ExactSizeIterator<Item = &'a str>,
) -> (Vec<&'a str>, Vec<u32>) {
    let mut topics: Vec<&str> = Vec::new();
    let mut index = Vec::with_capacity(topics_of_records.len());
    let mut last = 0usize;
    for topic in topics_of_records {
        let same = |t: &&str| floe_json_scan::bytes_eq(t.as_bytes(), topic.as_bytes());
        if !topics.get(last).is_some_and(same) {
            last = match topics.iter().position(same) {
                Some(i) => i,
                None => {
                    topics.push(topic);
                    topics.len() - 1
                }
            };
        }
        index.push(last as u32);
    }
    (topics, index)
}

/// The parts to retry after a fault in `range`: around the record a panic named, or
/// two halves.
fn split(range: Range<usize>, index: Option<u32>) -> Vec<Range<usize>> {
    let parts = match index.map(|i| range.start + i as usize) {
        Some(at) if at < range.end => vec![range.start..at, at..at + 1, at + 1..range.end],
        _ => {
            let mid = range.start + range.len() / 2;
            vec![range.start..mid, mid..range.end]
        }
    };
    parts.into_iter().filter(|r| !r.is_empty()).collect()
}

/// Why a plugin's answer for one record cannot be used: the record's error.
#[derive(Debug, Clone, thiserror::Error)]
enum AnswerError {
    /// A route or a name in a patch is not UTF-8.
    #[error("{what} is not UTF-8")]
    NotUtf8 {
        /// What it is: `a route`, `a patch path`, ...
        what: &'static str,
        /// Where the bytes stop being UTF-8.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A patch operation with no path.
    #[error("its patch names an empty path")]
    EmptyPath,
    /// The patch does not fit the record (e.g. it sets a field inside a number).
    #[error("its patch cannot be applied: {0}")]
    Patch(#[source] JsonError),
    /// An emitted record is not a JSON object.
    #[error("emitted something that is not a JSON object: {0}")]
    NotAnObject(#[source] JsonError),
}

fn text(bytes: &[u8], what: &'static str) -> Result<String, AnswerError> {
    str_of(bytes, what).map(str::to_string)
}

/// Reads the answers to `items` and applies them to the records.
fn decode(
    answers: &[u8],
    inputs: &[ChainInput<'_>],
    items: &[Item],
    max_outputs: usize,
) -> Result<Vec<Out>, FaultKind> {
    let mut reader = AnswerReader::new(answers)
        .map_err(|e| FaultKind::Contract(format!("unreadable answers: {e}")))?;
    if reader.count != items.len() {
        return Err(FaultKind::Contract(format!(
            "returned {} answers for {} records",
            reader.count,
            items.len()
        )));
    }
    let too_many = |n: usize| {
        FaultKind::Output(format!(
            "more than {max_outputs} records from one batch of {} (raise limits.max_outputs); {n} so far",
            items.len()
        ))
    };
    let mut outs = Vec::with_capacity(items.len());
    let mut produced = 0usize;
    // A patch's operations are taken as the reader checks them (read once, not twice),
    // into buffers reused from answer to answer.
    let mut ops = PatchOps::default();
    let mut names = KnownNames::default();
    for item in items {
        ops.clear();
        let answer = reader
            .next_answer_with(|op| ops.push(op, &mut names))
            .expect("as many answers as announced")
            .map_err(|e| FaultKind::Contract(format!("unreadable answers: {e}")))?;
        let route = |r: Option<&[u8]>| r.map(|r| text(r, "a route")).transpose();
        let out = match answer {
            wire::Answer::Unchanged { route: r } => {
                produced += 1;
                match route(r) {
                    Ok(r) => Out::Keep(r),
                    Err(e) => Out::Error(e.to_string()),
                }
            }
            wire::Answer::Dropped => Out::Drop,
            wire::Answer::Patch { route: r, .. } => {
                produced += 1;
                match route(r).and_then(|r| patch(value_of(inputs, item), &ops).map(|v| (v, r))) {
                    Ok((v, r)) => Out::Patched(v, r),
                    Err(e) => Out::Error(e.to_string()),
                }
            }
            wire::Answer::Emit { outputs } => {
                produced += outputs.len();
                if produced > max_outputs {
                    return Err(too_many(produced));
                }
                let parsed: Result<Vec<(JsonObject, Option<String>)>, AnswerError> = outputs
                    .map(|(r, json)| {
                        let r = route(r)?;
                        let v =
                            JsonObject::parse(json.to_vec()).map_err(AnswerError::NotAnObject)?;
                        Ok((v, r))
                    })
                    .collect();
                match parsed {
                    Ok(values) => Out::New(values),
                    Err(e) => Out::Error(e.to_string()),
                }
            }
            wire::Answer::Error { message } => {
                Out::Error(sanitize(&String::from_utf8_lossy(message), MESSAGE_BYTES))
            }
        };
        if produced > max_outputs {
            return Err(too_many(produced));
        }
        outs.push(out);
    }
    if !reader.at_end() {
        return Err(FaultKind::Contract("bytes after the last answer".into()));
    }
    Ok(outs)
}

/// Applies a patch to a record: in one pass when its paths are disjoint (the usual
/// answer: a few different fields), else one operation after the other. Names and
/// values are read in place from the answer: a patch costs the new record and a few
/// vectors, not a copy of every name.
fn patch(value: JsonView<'_>, ops: &PatchOps<'_>) -> Result<JsonObject, AnswerError> {
    if let Some(e) = &ops.error {
        return Err(e.clone());
    }
    // Pushed in place: a collected SmallVec is built aside and then copied whole.
    let mut refs: SmallVec<[PatchRef<'_>; INLINE_OPS]> = SmallVec::new();
    for op in &ops.ops {
        refs.push(op.as_patch(&ops.names));
    }
    value.apply_borrowed(&refs).map_err(AnswerError::Patch)
}

/// The operations of one patch answer, as the reader hands them over: on the stack
/// for the usual few (this runs for every patched record).
#[derive(Default)]
struct PatchOps<'a> {
    names: SmallVec<[&'a str; 2 * INLINE_OPS]>,
    ops: SmallVec<[ReadOp<'a>; INLINE_OPS]>,
    /// The first operation that cannot be applied (a name that is not UTF-8, an
    /// empty path): the record's error; the operations after it are not kept.
    error: Option<AnswerError>,
}

impl<'a> PatchOps<'a> {
    fn clear(&mut self) {
        self.names.clear();
        self.ops.clear();
        self.error = None;
    }

    fn push(&mut self, op: wire::Op<'a>, known: &mut KnownNames<'a>) {
        if self.error.is_none()
            && let Err(e) = self.try_push(op, known)
        {
            self.error = Some(e);
        }
    }

    fn try_push(
        &mut self,
        op: wire::Op<'a>,
        known: &mut KnownNames<'a>,
    ) -> Result<(), AnswerError> {
        let (path, action) = match op {
            wire::Op::Set { path, value } => (path, ReadAction::Set(value)),
            wire::Op::Remove { path } => (path, ReadAction::Remove),
            wire::Op::Rename { path, to } => (
                path,
                ReadAction::Rename(known.str_of(to, "a new field name")?),
            ),
        };
        if path.is_empty() {
            return Err(AnswerError::EmptyPath);
        }
        let start = self.names.len();
        for name in path {
            self.names.push(known.str_of(name, "a patch path")?);
        }
        self.ops.push(ReadOp {
            names: start..self.names.len(),
            action,
        });
        Ok(())
    }
}

/// Names the patches of one call used, each checked to be UTF-8 once: a plugin's
/// patches name the same few fields record after record, and comparing bytes costs
/// a fraction of a check.
#[derive(Default)]
struct KnownNames<'a>(SmallVec<[&'a str; 16]>);

impl<'a> KnownNames<'a> {
    fn str_of(&mut self, bytes: &'a [u8], what: &'static str) -> Result<&'a str, AnswerError> {
        let same = |s: &&&'a str| floe_json_scan::bytes_eq(s.as_bytes(), bytes);
        if let Some(&s) = self.0.iter().find(same) {
            return Ok(s);
        }
        let s = str_of(bytes, what)?;
        if !self.0.spilled() && self.0.len() < self.0.inline_size() {
            self.0.push(s);
        }
        Ok(s)
    }
}

/// One operation of a plugin's patch: its names (a range of the patch's names) and
/// what it does.
struct ReadOp<'a> {
    names: Range<usize>,
    action: ReadAction<'a>,
}

enum ReadAction<'a> {
    Set(&'a [u8]),
    Remove,
    Rename(&'a str),
}

impl<'a> ReadOp<'a> {
    fn as_patch<'p>(&'p self, names: &'p [&'a str]) -> PatchRef<'p>
    where
        'a: 'p,
    {
        let path = &names[self.names.clone()];
        match self.action {
            ReadAction::Set(value) => PatchRef::Set { path, value },
            ReadAction::Remove => PatchRef::Remove { path },
            ReadAction::Rename(to) => PatchRef::Rename { path, to },
        }
    }
}

fn str_of<'a>(bytes: &'a [u8], what: &'static str) -> Result<&'a str, AnswerError> {
    std::str::from_utf8(bytes).map_err(|source| AnswerError::NotUtf8 { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of several topics in one call: each topic is listed once, in order of
    /// first use, and every record points at its own, also after a switch back.
    #[test]
    fn every_record_points_at_its_topic() {
        let (table, index) = topic_table(["a", "a", "bb", "a", "c", "bb", "bb"].into_iter());
        assert_eq!(table, ["a", "bb", "c"]);
        assert_eq!(index, [0, 0, 1, 0, 2, 1, 1]);
        let (table, index) = topic_table(std::iter::empty());
        assert!(table.is_empty() && index.is_empty());
    }

    #[test]
    fn a_chain_can_move_to_the_pipeline_thread() {
        fn send<T: Send>() {}
        send::<TransformChain>();
        send::<ChainResult>();
    }

    /// Five inputs, all `value` at offsets 0-4 of topic `t`, and their items before
    /// any plugin.
    fn five_records(value: &JsonObject) -> (Vec<ChainInput<'_>>, Vec<Item>) {
        let inputs = (0..5)
            .map(|i| ChainInput {
                value: value.view(),
                topic: "t",
                partition: 0,
                offset: i,
                timestamp_ms: None,
                key: None,
            })
            .collect();
        let items = (0..5)
            .map(|origin| Item {
                origin,
                value: None,
                route: None,
            })
            .collect();
        (inputs, items)
    }

    /// `o` patched by `count` encoded `ops`, read back from an answer buffer.
    fn patch_of(o: &JsonObject, count: u32, ops: &[u8]) -> Result<JsonObject, String> {
        let mut w = wire::AnswerWriter::new(1, 0);
        w.patch(None, count, ops);
        let answers = w.finish();
        let mut r = AnswerReader::new(&answers).unwrap();
        let (mut read, mut names) = (PatchOps::default(), KnownNames::default());
        let Some(Ok(wire::Answer::Patch { .. })) =
            r.next_answer_with(|op| read.push(op, &mut names))
        else {
            panic!("a patch")
        };
        patch(o.view(), &read).map_err(|e| e.to_string())
    }

    #[test]
    fn a_null_parent_becomes_an_object() {
        let o = JsonObject::parse(br#"{"meta": null, "k": {"x": null}, "s": 1}"#.to_vec()).unwrap();
        let mut ops = Vec::new();
        wire::put_set(&mut ops, ["meta", "a", "b"].into_iter(), b"1");
        wire::put_set(&mut ops, ["k", "x", "q\""].into_iter(), b"true");
        wire::put_set(&mut ops, ["new", "c"].into_iter(), b"2");
        wire::put_remove(&mut ops, ["s", "z"].into_iter());
        assert_eq!(
            patch_of(&o, 4, &ops).unwrap().to_serde(),
            serde_json::json!({"meta": {"a": {"b": 1}}, "k": {"x": {"q\"": true}}, "s": 1, "new": {"c": 2}})
        );
        let mut bad = Vec::new();
        wire::put_set(&mut bad, ["s", "z"].into_iter(), b"1");
        assert!(
            patch_of(&o, 1, &bad)
                .unwrap_err()
                .contains("cannot set s.z")
        );

        // Two sets through the same null parent see each other (one after the other).
        let mut two = Vec::new();
        wire::put_set(&mut two, ["meta", "a", "b"].into_iter(), b"1");
        wire::put_set(&mut two, ["meta", "a", "c"].into_iter(), b"2");
        assert_eq!(
            patch_of(&o, 2, &two).unwrap().to_serde(),
            serde_json::json!({"meta": {"a": {"b": 1, "c": 2}}, "k": {"x": null}, "s": 1})
        );
    }

    /// Patches read in one pass: names repeated from patch to patch (checked once,
    /// then matched by their bytes) apply to each record, and a name that is not
    /// UTF-8 or an empty path is that record's error, not the call's.
    #[test]
    fn patch_names_are_checked_once_and_bad_ones_fail_their_record() {
        let a = JsonObject::parse(br#"{"a": 1, "b": 2}"#.to_vec()).unwrap();
        let (inputs, items) = five_records(&a);
        let mut renames = Vec::new();
        wire::put_rename(&mut renames, ["a"].into_iter(), "x");
        wire::put_set(&mut renames, ["y"].into_iter(), b"3");
        let mut others = Vec::new();
        wire::put_rename(&mut others, ["b"].into_iter(), "x");
        wire::put_remove(&mut others, ["a"].into_iter());
        let mut not_utf8 = Vec::new();
        wire::put_remove(&mut not_utf8, ["a"].into_iter());
        not_utf8.extend_from_slice(&[wire::op::REMOVE, 1, 0, 0, 0, 1, 0, 0, 0, 0xff]);
        let mut empty = Vec::new();
        empty.extend_from_slice(&[wire::op::REMOVE, 0, 0, 0, 0]);
        let mut w = wire::AnswerWriter::new(5, 0);
        w.patch(None, 2, &renames);
        w.patch(None, 2, &others);
        w.patch(None, 2, &not_utf8);
        w.patch(None, 2, &renames);
        w.patch(None, 1, &empty);
        let outs = decode(&w.finish(), &inputs, &items, 100).unwrap();
        let patched = |i: usize| match &outs[i] {
            Out::Patched(v, None) => v.to_serde(),
            _ => panic!("answer {i} is not a patched record"),
        };
        assert_eq!(patched(0), serde_json::json!({"x": 1, "b": 2, "y": 3}));
        assert_eq!(patched(1), serde_json::json!({"x": 2}));
        assert!(matches!(&outs[2], Out::Error(e) if e.contains("a patch path is not UTF-8")));
        assert_eq!(patched(3), serde_json::json!({"x": 1, "b": 2, "y": 3}));
        assert!(matches!(&outs[4], Out::Error(e) if e.contains("empty path")));
    }

    #[test]
    fn splits_around_a_reported_record_or_in_halves() {
        assert_eq!(split(0..10, None), vec![0..5, 5..10]);
        assert_eq!(split(4..7, None), vec![4..5, 5..7]);
        assert_eq!(split(0..10, Some(3)), vec![0..3, 3..4, 4..10]);
        assert_eq!(split(10..20, Some(0)), vec![10..11, 11..20]);
        assert_eq!(split(10..20, Some(9)), vec![10..19, 19..20]);
        assert_eq!(
            split(10..20, Some(10)),
            vec![10..15, 15..20],
            "an index out of range is ignored"
        );
    }

    #[test]
    fn answers_are_applied_to_the_records() {
        let a = JsonObject::parse(br#"{"a": 1, "b": 2}"#.to_vec()).unwrap();
        let (inputs, items) = five_records(&a);
        let mut ops = Vec::new();
        wire::put_set(&mut ops, ["c"].into_iter(), b"[3]");
        wire::put_remove(&mut ops, ["a"].into_iter());
        let mut bad = Vec::new();
        wire::put_set(&mut bad, ["a", "x"].into_iter(), b"1");
        let mut w = wire::AnswerWriter::new(5, 0);
        w.unchanged(Some("eu"));
        w.patch(None, 2, &ops);
        w.emit([(None, &b"{\"n\":1}"[..]), (Some("x"), &b"[1]"[..])].into_iter());
        w.patch(None, 1, &bad);
        w.dropped();
        let outs = decode(&w.finish(), &inputs, &items, 100).unwrap();
        assert!(matches!(&outs[0], Out::Keep(Some(r)) if r == "eu"));
        assert!(
            matches!(&outs[1], Out::Patched(v, None) if v.to_serde() == serde_json::json!({"b": 2, "c": [3]}))
        );
        assert!(matches!(&outs[2], Out::Error(e) if e.contains("not a JSON object")));
        assert!(matches!(&outs[3], Out::Error(e) if e.contains("cannot set a.x")));
        assert!(matches!(&outs[4], Out::Drop));

        let mut w = wire::AnswerWriter::new(4, 0);
        for _ in 0..4 {
            w.unchanged(None);
        }
        let answers = w.finish();
        assert!(
            matches!(decode(&answers, &inputs, &items, 100), Err(FaultKind::Contract(m)) if m.contains("4 answers for 5 records"))
        );
        assert!(matches!(
            decode(&answers, &inputs, &items[..4], 3),
            Err(FaultKind::Output(_))
        ));
        let mut trailing = answers.clone();
        trailing.push(0);
        assert!(
            matches!(decode(&trailing, &inputs, &items[..4], 100), Err(FaultKind::Contract(m)) if m.contains("after the last answer"))
        );
    }
}
