//! One pipeline, wiring the stages in the order a record travels:
//! source -> decode -> transform -> schema -> (buffer) -> batch -> sink -> offsets.
//!
//! Records are buffered per output table until the commit interval passes or a size
//! threshold is hit; then each buffer becomes Parquet files and one snapshot. A record
//! leaves a buffer only by being committed (or dead-lettered and synced before that
//! commit), so the offsets stored in a table never pass data that is not durable.
//!
//! With several tables (plugins routing records to streams), every table stores the
//! offsets it covers. The pipeline reads from the smallest of them and each table skips
//! records it already holds, so every table gets every record exactly once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::PipelineConfig;
use crate::dead_letter::{DeadLetterError, DeadLetterWriter};
use crate::decode::{DecodeError, Decoder, decode_json, validate_object};
use crate::offsets::OffsetMap;
use crate::schema::{OnIncompatible, SchemaTracker};
use crate::sink::upsert::KeyHash;
use crate::sink::{SinkError, Staged, TableSink};
use crate::source::{
    KafkaRecord, KafkaSource, PartitionMap, Positions, SourceCommand, SourceError, SourceEvent,
    TopicPartition,
};
use crate::transform::{OnError, TransformChain, TransformEngine, TransformError};
use crate::{failpoint, telemetry};

/// A table with no new rows still records the pipeline's progress every this many
/// commit rounds, so a restart does not re-read much for it.
const OFFSETS_ONLY_EVERY: u32 = 10;

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Kafka side.
    #[error("pipeline {pipeline}: {source}")]
    Source {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<SourceError>,
    },
    /// Iceberg side.
    #[error("pipeline {pipeline}: {source}")]
    Sink {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<SinkError>,
    },
    /// Dead-letter file.
    #[error("pipeline {pipeline}: {source}")]
    DeadLetter {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<DeadLetterError>,
    },
    /// A plugin could not start, faulted too often, or failed a record under `on_error = "fail"`.
    #[error("pipeline {pipeline}: {source}")]
    Transform {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<TransformError>,
    },
    /// Decoding cannot go on (schema registry unreachable, schema file unreadable).
    #[error("pipeline {pipeline}: {source}")]
    Decode {
        /// Pipeline name.
        pipeline: String,
        /// Cause.
        source: Box<DecodeError>,
    },
    /// A value does not fit its column and the policy is `on_incompatible = "fail"`.
    #[error(
        "pipeline {pipeline}: incompatible value in {topic}/{partition}@{offset}: {conflict} (on_incompatible = \"fail\")"
    )]
    Incompatible {
        /// Pipeline name.
        pipeline: String,
        /// Topic of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// Field, column type and value type.
        conflict: Box<crate::schema::Conflict>,
    },
    /// A record failed in a plugin whose policy is `fail`.
    #[error(
        "pipeline {pipeline}: plugin {plugin} failed on {topic}/{partition}@{offset}: {message} (on_error = \"fail\")"
    )]
    RecordFailed {
        /// Pipeline name.
        pipeline: String,
        /// Plugin name.
        plugin: String,
        /// Topic of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// What the plugin said.
        message: String,
    },
}

impl PipelineError {
    /// Wraps sink errors of `pipeline` (for `map_err`).
    fn sink(pipeline: &str) -> impl Fn(SinkError) -> PipelineError + Copy + '_ {
        move |e| PipelineError::Sink {
            pipeline: pipeline.to_string(),
            source: Box::new(e),
        }
    }
}

/// One output table: its sink, schema, committed offsets and buffered rows.
struct Table {
    sink: TableSink,
    tracker: SchemaTracker,
    /// What the table stores for this pipeline.
    committed: OffsetMap,
    buffer: Vec<KafkaRecord>,
    /// Upsert mode: the key of each buffered record.
    keys: Vec<KeyHash>,
    buffer_bytes: u64,
    rounds_without_commit: u32,
}

impl Table {
    /// Whether the table already holds the record at `offset` of `tp`.
    fn holds(&self, tp: &TopicPartition, offset: i64) -> bool {
        self.committed.0.get(tp).is_some_and(|&c| offset < c)
    }

    fn discard(&mut self) {
        self.buffer.clear();
        self.keys.clear();
        self.buffer_bytes = 0;
        let options = self.tracker.options().clone();
        self.tracker = self.sink.tracker().with_options(options);
    }
}

/// What the later stages need to know of a record's decoding.
#[derive(Default)]
struct Origin {
    /// The message as read, when its value or key was rewritten (Avro -> JSON, decoded
    /// key): dead letters carry these original bytes.
    raw: Option<KafkaRecord>,
    /// The writer schema's columns (Avro).
    declared: Option<Arc<iceberg::spec::StructType>>,
}

struct Pipeline {
    config: PipelineConfig,
    decoder: Decoder,
    chain: TransformChain,
    dead_letters: DeadLetterWriter,
    positions: Arc<Positions>,
    /// Index 0 is the default table; then one per configured stream.
    tables: Vec<Table>,
    routes: HashMap<String, usize>,
    /// Next offset expected per partition: the end of what is buffered, or the resume point.
    next: PartitionMap<i64>,
    /// Records read before the last seek are ignored (see [`SourceCommand::Seek`]).
    epoch: u64,
    assigned: Vec<TopicPartition>,
    last_flush: Instant,
    last_commit: Instant,
    consecutive_faults: u32,
}

/// Runs one pipeline until `shutdown` turns true or an error stops it.
pub async fn run_pipeline(
    config: PipelineConfig,
    catalog: crate::sink::CatalogHandle,
    engine: Option<TransformEngine>,
    writer_id: String,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let name = config.name.clone();
    telemetry::health::pipeline_started(&name, config.sink.commit_interval);
    let sink_err = PipelineError::sink(&name);
    let mut table_names = vec![config.sink.table.clone()];
    let mut routes = HashMap::new();
    for (stream, table) in &config.sink.streams {
        routes.insert(stream.clone(), table_names.len());
        table_names.push(table.clone());
    }
    let decoder = Decoder::new(&config.decode).map_err(|source| PipelineError::Decode {
        pipeline: name.clone(),
        source: Box::new(source),
    })?;
    let schema_options = Arc::new(config.schema.options());
    let mut tables = Vec::with_capacity(table_names.len());
    for table in &table_names {
        let sink = TableSink::open(&catalog, &config.sink, table, &config.name, &writer_id)
            .await
            .map_err(sink_err)?;
        let committed = sink.stored_offsets().map_err(sink_err)?;
        tables.push(Table {
            tracker: sink.tracker().with_options(schema_options.clone()),
            sink,
            committed,
            buffer: Vec::new(),
            keys: Vec::new(),
            buffer_bytes: 0,
            rounds_without_commit: 0,
        });
    }
    let chain = match (&engine, config.transforms.is_empty()) {
        (_, true) => TransformChain::empty(),
        (Some(engine), false) => TransformChain::new(&config.name, engine, &config.transforms)
            .map_err(|source| PipelineError::Transform {
                pipeline: name.clone(),
                source: Box::new(source),
            })?,
        (None, false) => unreachable!("run() builds an engine when any pipeline has transforms"),
    };
    let dead_letters =
        DeadLetterWriter::open(&config.name, &config.dead_letter).map_err(|source| {
            PipelineError::DeadLetter {
                pipeline: name.clone(),
                source: Box::new(source),
            }
        })?;

    let mut p = Pipeline {
        config,
        decoder,
        chain,
        dead_letters,
        positions: Arc::new(Positions::default()),
        tables,
        routes,
        next: PartitionMap::default(),
        epoch: 0,
        assigned: Vec::new(),
        last_flush: Instant::now(),
        last_commit: Instant::now(),
        consecutive_faults: 0,
    };
    let resume = p.resume_offsets();
    p.positions.replace(resume.0.clone());
    p.next = resume.0.clone();
    tracing::info!(pipeline = %name, tables = ?table_names, partitions_with_offsets = resume.0.len(), "resuming from offsets stored in the table(s)");
    let mut source = KafkaSource::start(&p.config.name, &p.config.source, p.positions.clone())
        .map_err(|source| PipelineError::Source {
            pipeline: name.clone(),
            source: Box::new(source),
        })?;

    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let result = loop {
        tokio::select! {
            _ = shutdown.changed() => {
                tracing::info!(pipeline = %name, "shutting down: committing what is buffered");
                break p.flush(&source, true).await;
            }
            event = source.events.recv() => {
                let step = match event {
                    Some(SourceEvent::Records(epoch, records)) if epoch == p.epoch => match p.prepare(&records).await {
                        Ok(()) => p.accept_all(records, &source),
                        Err(e) => Err(e),
                    },
                    Some(SourceEvent::Records(..)) => Ok(()),
                    Some(SourceEvent::Assigned(tps)) => { telemetry::rebalanced(&name, "assigned"); telemetry::health::partitions_assigned(&name, tps.len()); p.assigned = tps; Ok(()) }
                    Some(SourceEvent::Revoked) => { telemetry::rebalanced(&name, "revoked"); telemetry::health::partitions_assigned(&name, 0); p.discard_buffers(); Ok(()) }
                    Some(SourceEvent::Failed(reason)) => Err(PipelineError::Source { pipeline: name.clone(), source: Box::new(SourceError::Stopped(reason)) }),
                    None => Err(PipelineError::Source { pipeline: name.clone(), source: Box::new(SourceError::Stopped("channel closed".into())) }),
                };
                if let Err(e) = step { break Err(e); }
                if p.buffer_full() && let Err(e) = p.flush(&source, false).await { break Err(e); }
            }
            _ = tick.tick() => {
                telemetry::seconds_since_last_commit(&name, p.last_commit.elapsed().as_secs_f64());
                if p.last_flush.elapsed() >= p.config.sink.commit_interval && let Err(e) = p.flush(&source, false).await { break Err(e); }
            }
        }
    };
    source.shutdown();
    telemetry::health::pipeline_stopped(
        &name,
        result.as_ref().err().map(|e| e.to_string()).as_deref(),
    );
    result
}

impl Pipeline {
    /// Where reading continues: per partition, the smallest offset any table stores
    /// (a table without the partition needs it from the start).
    fn resume_offsets(&self) -> OffsetMap {
        let mut resume: PartitionMap<i64> = PartitionMap::default();
        let mut missing = std::collections::HashSet::new();
        for t in &self.tables {
            for (tp, &o) in &t.committed.0 {
                resume
                    .entry(tp.clone())
                    .and_modify(|r| *r = (*r).min(o))
                    .or_insert(o);
            }
        }
        for tp in resume.keys() {
            if self
                .tables
                .iter()
                .any(|t| t.sink.exists() && !t.committed.0.contains_key(tp))
            {
                missing.insert(tp.clone());
            }
        }
        resume.retain(|tp, _| !missing.contains(tp));
        OffsetMap(resume)
    }

    fn buffer_full(&self) -> bool {
        let bytes: u64 = self.tables.iter().map(|t| t.buffer_bytes).sum();
        let records: usize = self.tables.iter().map(|t| t.buffer.len()).sum();
        bytes >= self.config.sink.flush_bytes || records >= self.config.sink.flush_records
    }

    fn dl_err(&self, source: DeadLetterError) -> PipelineError {
        PipelineError::DeadLetter {
            pipeline: self.config.name.clone(),
            source: Box::new(source),
        }
    }

    /// Decodes a batch from Kafka, runs the plugins, and buffers or dead-letters every record.
    fn accept_all(
        &mut self,
        records: Vec<KafkaRecord>,
        source: &KafkaSource,
    ) -> Result<(), PipelineError> {
        telemetry::records_in(&self.config.name, records.len() as u64);
        let mut for_chain = Vec::new();
        for record in records {
            let next = self
                .next
                .entry((record.topic.clone(), record.partition))
                .or_insert(record.offset);
            if record.offset < *next {
                // Already committed or buffered (re-delivery after a rebalance or seek).
                continue;
            }
            if record.offset > *next {
                telemetry::offset_gap(&self.config.name, (record.offset - *next) as u64);
            }
            *next = record.offset + 1;
            let (row, origin) = match self.decode_key(record)? {
                Some(r) => r,
                None => continue,
            };
            let Some(value) = &row.value else {
                // A tombstone is a row with only the Kafka columns; plugins never see it.
                self.buffer(0, row, None, &origin)?;
                continue;
            };
            if !self.decoder.is_json() {
                let decoded = match self.decoder.decode_value(value) {
                    Ok(d) => d,
                    Err(e @ DecodeError::RegistryUnreachable { .. }) => {
                        return Err(PipelineError::Decode {
                            pipeline: self.config.name.clone(),
                            source: Box::new(e),
                        });
                    }
                    Err(e) => {
                        self.dead_letter(
                            origin.raw.as_ref().unwrap_or(&row),
                            "decode",
                            &e.to_string(),
                        )?;
                        continue;
                    }
                };
                // Later stages read the JSON representation; dead letters keep the Avro bytes.
                let json = serde_json::to_vec(&decoded.object).expect("JSON values serialize");
                let origin = Origin {
                    raw: Some(origin.raw.unwrap_or_else(|| row.clone_meta_with_value())),
                    declared: decoded.declared,
                };
                let row = KafkaRecord {
                    value: Some(json),
                    ..row.clone_meta()
                };
                if self.chain.is_empty() {
                    self.buffer(0, row, Some(decoded.object), &origin)?;
                } else {
                    for_chain.push((row, origin));
                }
            } else if self.chain.is_empty() {
                match decode_json(value) {
                    Ok(decoded) => self.buffer(0, row, Some(decoded), &origin)?,
                    Err(e) => self.dead_letter(
                        origin.raw.as_ref().unwrap_or(&row),
                        "decode",
                        &e.to_string(),
                    )?,
                }
            } else {
                // Plugins parse the value themselves: only check it is a JSON object here.
                match validate_object(value) {
                    Ok(()) => for_chain.push((row, origin)),
                    Err(e) => self.dead_letter(
                        origin.raw.as_ref().unwrap_or(&row),
                        "decode",
                        &e.to_string(),
                    )?,
                }
            }
        }
        if !for_chain.is_empty() {
            self.transform(for_chain, source)?;
        }
        Ok(())
    }

    /// Fetches the registry schemas a batch refers to (the only await of decoding).
    async fn prepare(&mut self, records: &[KafkaRecord]) -> Result<(), PipelineError> {
        let values = self
            .decoder
            .values_use_registry()
            .then(|| records.iter().filter_map(|r| r.value.as_deref()))
            .into_iter()
            .flatten();
        let keys = self
            .decoder
            .keys_use_registry()
            .then(|| records.iter().filter_map(|r| r.key.as_deref()))
            .into_iter()
            .flatten();
        let ids = self.decoder.missing_ids(values.chain(keys));
        if ids.is_empty() {
            return Ok(());
        }
        self.decoder
            .fetch(ids)
            .await
            .map_err(|source| PipelineError::Decode {
                pipeline: self.config.name.clone(),
                source: Box::new(source),
            })
    }

    /// Decodes the key into the text of `_kafka_key`; `None` when the record was
    /// dead-lettered because its key cannot be decoded.
    fn decode_key(
        &mut self,
        record: KafkaRecord,
    ) -> Result<Option<(KafkaRecord, Origin)>, PipelineError> {
        let Some(key) = &record.key else {
            return Ok(Some((record, Origin::default())));
        };
        if self.decoder.key_is_string() {
            // The common case: keep the key as is, without copying it.
            if std::str::from_utf8(key).is_ok() {
                return Ok(Some((record, Origin::default())));
            }
            let reason = "message key is not UTF-8 (the _kafka_key column is a string)";
            self.dead_letter(&record, "decode", reason)?;
            return Ok(None);
        }
        match self.decoder.decode_key(key) {
            Ok(text) => {
                let row = KafkaRecord {
                    key: Some(text.into_bytes()),
                    value: record.value.clone(),
                    ..record.clone_meta()
                };
                let origin = Origin {
                    raw: Some(record),
                    declared: None,
                };
                Ok(Some((row, origin)))
            }
            Err(DecodeError::Key(inner))
                if matches!(*inner, DecodeError::RegistryUnreachable { .. }) =>
            {
                Err(PipelineError::Decode {
                    pipeline: self.config.name.clone(),
                    source: inner,
                })
            }
            Err(e) => {
                self.dead_letter(&record, "decode", &e.to_string())?;
                Ok(None)
            }
        }
    }

    /// Runs records through the plugin chain and buffers what comes out.
    fn transform(
        &mut self,
        records: Vec<(KafkaRecord, Origin)>,
        source: &KafkaSource,
    ) -> Result<(), PipelineError> {
        let (records, origins): (Vec<KafkaRecord>, Vec<Origin>) = records.into_iter().unzip();
        let refs: Vec<&KafkaRecord> = records.iter().collect();
        let result = match self.chain.run(&refs) {
            Ok(r) => r,
            Err(TransformError::Fault(fault)) => {
                self.consecutive_faults += 1;
                telemetry::records_failed(&self.config.name, "transform_fault");
                if self.consecutive_faults >= self.config.max_consecutive_faults {
                    tracing::error!(pipeline = %self.config.name, %fault, faults = self.consecutive_faults, "plugin faulted too often: stopping");
                    return Err(PipelineError::Transform {
                        pipeline: self.config.name.clone(),
                        source: Box::new(fault.into()),
                    });
                }
                tracing::warn!(pipeline = %self.config.name, %fault, faults = self.consecutive_faults, "plugin fault: dropping uncommitted records, rebuilding the plugin, re-reading");
                self.rewind(source);
                return Ok(());
            }
            Err(other) => {
                return Err(PipelineError::Transform {
                    pipeline: self.config.name.clone(),
                    source: Box::new(other),
                });
            }
        };
        self.consecutive_faults = 0;
        for e in &result.errors {
            let record = origins[e.origin].raw.as_ref().unwrap_or(&records[e.origin]);
            match e.policy {
                OnError::DeadLetter => {
                    telemetry::plugin_record_error(&self.config.name, &e.plugin, "dead_letter");
                    self.dead_letter(
                        record,
                        "transform",
                        &format!("plugin {}: {}", e.plugin, e.message),
                    )?;
                }
                OnError::Drop => {
                    telemetry::plugin_record_error(&self.config.name, &e.plugin, "drop")
                }
                OnError::Fail => {
                    telemetry::plugin_record_error(&self.config.name, &e.plugin, "fail");
                    return Err(PipelineError::RecordFailed {
                        pipeline: self.config.name.clone(),
                        plugin: e.plugin.clone(),
                        topic: record.topic.to_string(),
                        partition: record.partition,
                        offset: record.offset,
                        message: e.message.clone(),
                    });
                }
            }
        }
        for out in result.outputs {
            let from = &origins[out.origin];
            let origin = from.raw.as_ref().unwrap_or(&records[out.origin]);
            let table = match &out.route {
                None => 0,
                Some(stream) => match self.routes.get(stream) {
                    Some(&i) => i,
                    None => {
                        let reason = format!(
                            "routed to stream {stream:?}, which has no table in [pipelines.sink.streams]"
                        );
                        self.dead_letter(origin, "transform", &reason)?;
                        continue;
                    }
                },
            };
            let decoded = match decode_json(&out.value) {
                Ok(m) => m,
                Err(e) => {
                    self.dead_letter(origin, "transform", &format!("plugin output: {e}"))?;
                    continue;
                }
            };
            let row = KafkaRecord {
                value: Some(out.value),
                ..records[out.origin].clone_meta()
            };
            // Declared types are hints here: only fields whose values still fit them keep them.
            let hints = Origin {
                raw: from.raw.as_ref().map(KafkaRecord::clone_meta_with_value),
                declared: from.declared.clone(),
            };
            self.buffer(table, row, Some(decoded), &hints)?;
        }
        Ok(())
    }

    /// Checks a row against its table's schema and buffers it (or applies the
    /// `on_incompatible` policy).
    fn buffer(
        &mut self,
        table: usize,
        mut row: KafkaRecord,
        decoded: Option<serde_json::Map<String, serde_json::Value>>,
        origin: &Origin,
    ) -> Result<(), PipelineError> {
        let tp = (row.topic.clone(), row.partition);
        let t = &mut self.tables[table];
        if t.holds(&tp, row.offset) {
            return Ok(());
        }
        let key = match t
            .sink
            .key_spec()
            .map(|spec| spec.of_record(&row, decoded.as_ref()))
        {
            Some(Err(reason)) => {
                let record = origin.raw.as_ref().unwrap_or(&row);
                return self.dead_letter(record, "key", &reason);
            }
            Some(Ok(key)) => Some(key),
            None => None,
        };
        if let Some(mut map) = decoded {
            let hints = origin.declared.as_deref();
            if let Some(declared) = &origin.declared
                && self.chain.is_empty()
            {
                // The whole writer schema: columns exist even while their values are null.
                t.tracker.declare(declared);
            }
            if let Err(mut conflict) = t.tracker.observe_with(&map, hints) {
                let mut coerced = false;
                if self.config.schema.on_incompatible == OnIncompatible::Coerce
                    && t.tracker.coerce(&mut map)
                {
                    // What still conflicts after coercion is the reason given.
                    match t.tracker.observe_with(&map, hints) {
                        Ok(()) => coerced = true,
                        Err(c) => conflict = c,
                    }
                }
                if coerced {
                    row.value = Some(serde_json::to_vec(&map).expect("JSON values serialize"));
                } else if self.config.schema.on_incompatible == OnIncompatible::Fail {
                    return Err(PipelineError::Incompatible {
                        pipeline: self.config.name.clone(),
                        topic: row.topic.to_string(),
                        partition: row.partition,
                        offset: row.offset,
                        conflict: Box::new(conflict),
                    });
                } else {
                    let record = origin.raw.as_ref().unwrap_or(&row);
                    return self.dead_letter(record, "schema", &conflict.to_string());
                }
            }
        }
        t.keys.extend(key);
        t.buffer_bytes += row.value.as_ref().map_or(0, |v| v.len() as u64);
        t.buffer.push(row);
        Ok(())
    }

    fn dead_letter(
        &mut self,
        record: &KafkaRecord,
        stage: &'static str,
        reason: &str,
    ) -> Result<(), PipelineError> {
        tracing::debug!(pipeline = %self.config.name, topic = %record.topic, partition = record.partition, offset = record.offset, stage, reason, "dead-lettered");
        telemetry::records_failed(&self.config.name, stage);
        telemetry::dead_letter(&self.config.name, stage);
        self.dead_letters
            .write(record, stage, reason)
            .map_err(|e| self.dl_err(e))?;
        Ok(())
    }

    /// Drops everything not yet committed; the consumer re-reads it from the stored offsets.
    fn discard_buffers(&mut self) {
        for t in &mut self.tables {
            t.discard();
        }
        self.next = self.resume_offsets().0;
    }

    /// Drops what is buffered and moves the consumer back to the stored offsets.
    fn rewind(&mut self, source: &KafkaSource) {
        self.discard_buffers();
        let resume = self.resume_offsets();
        self.positions.replace(resume.0.clone());
        self.epoch += 1;
        let positions = self
            .assigned
            .iter()
            .map(|tp| (tp.clone(), resume.0.get(tp).copied()))
            .collect();
        source.command(SourceCommand::Seek {
            epoch: self.epoch,
            positions,
        });
    }

    /// Commits every table's buffer as one snapshot per table, with the offsets it covers.
    /// `closing`: also record progress in tables without new rows.
    async fn flush(&mut self, source: &KafkaSource, closing: bool) -> Result<(), PipelineError> {
        let name = self.config.name.clone();
        self.last_flush = Instant::now();
        let started = Instant::now();
        let before = self.resume_offsets();
        let mut synced = false;
        let mut committed_any = false;
        if self.tables.iter().any(|t| !t.buffer.is_empty()) {
            failpoint::hit(failpoint::BEFORE_WRITE);
        }
        // Schemas first: every table that receives rows exists (a new one starting at
        // `before`) before any table commits, so a crash between two tables' commits
        // leaves the later tables behind and the pipeline re-reads for them.
        for t in self.tables.iter_mut().filter(|t| !t.buffer.is_empty()) {
            let sink_err = PipelineError::sink(&name);
            t.sink
                .apply_schema(&t.tracker, &before)
                .await
                .map_err(sink_err)?;
            // A table created just now stores `before`.
            t.committed = t.sink.stored_offsets().map_err(sink_err)?;
        }
        for i in 0..self.tables.len() {
            let t = &mut self.tables[i];
            let mut target = t.committed.clone();
            target
                .0
                .extend(self.next.iter().map(|(tp, o)| (tp.clone(), *o)));
            let has_rows = !t.buffer.is_empty();
            if target == t.committed {
                continue;
            }
            if !has_rows && !closing && t.rounds_without_commit + 1 < OFFSETS_ONLY_EVERY {
                t.rounds_without_commit += 1;
                continue;
            }
            if !has_rows && !t.sink.exists() {
                continue;
            }
            let files = if has_rows {
                let keys = t.sink.key_spec().is_some().then_some(&t.keys[..]);
                let files = t
                    .sink
                    .write(&t.buffer, keys)
                    .await
                    .map_err(PipelineError::sink(&name))?;
                failpoint::hit(failpoint::AFTER_WRITE);
                files
            } else {
                Staged::empty()
            };
            if !synced {
                self.dead_letters.sync().map_err(|e| self.dl_err(e))?;
                synced = true;
            }
            let t = &mut self.tables[i];
            let bytes = files.data_bytes();
            match t.sink.commit(files, &t.committed, &target).await {
                Ok(outcome) => {
                    let rows = t.buffer.len();
                    tracing::info!(pipeline = %self.config.name, table = %t.sink.ident(), snapshot_id = outcome.snapshot_id, files = outcome.files, delete_files = outcome.delete_files, rows, ms = started.elapsed().as_millis() as u64, "committed");
                    telemetry::records_out(&self.config.name, rows as u64);
                    telemetry::committed(&self.config.name, outcome.files);
                    telemetry::commit_duration(&self.config.name, started.elapsed());
                    telemetry::bytes_committed(&self.config.name, bytes);
                    telemetry::health::table_committed(
                        &self.config.name,
                        &t.sink.ident().to_string(),
                    );
                    t.committed = target;
                    t.rounds_without_commit = 0;
                    t.discard();
                    committed_any = true;
                    failpoint::hit(failpoint::AFTER_COMMIT);
                }
                Err(SinkError::Fenced(reason)) => {
                    telemetry::fenced(&self.config.name);
                    tracing::warn!(pipeline = %self.config.name, table = %t.sink.ident(), %reason, "commit fenced: reloading offsets from the tables and re-reading");
                    for t in &mut self.tables {
                        t.sink.reload().await.map_err(PipelineError::sink(&name))?;
                        t.committed = t
                            .sink
                            .stored_offsets()
                            .map_err(PipelineError::sink(&name))?;
                    }
                    self.rewind(source);
                    return Ok(());
                }
                Err(e) => return Err(PipelineError::sink(&name)(e)),
            }
        }
        if !synced {
            self.dead_letters.sync().map_err(|e| self.dl_err(e))?;
        }
        if committed_any {
            self.last_commit = Instant::now();
            let resume = self.resume_offsets();
            self.positions.replace(resume.0.clone());
            self.dead_letters.forget_below(&resume.0);
            let group: Vec<_> = self
                .assigned
                .iter()
                .filter_map(|tp| resume.0.get(tp).map(|o| (tp.clone(), *o)))
                .collect();
            source.command(SourceCommand::CommitGroupOffsets(group));
        }
        telemetry::health::flush_completed(&name);
        Ok(())
    }
}

impl KafkaRecord {
    /// A full copy (kept as the original bytes of a rewritten record).
    fn clone_meta_with_value(&self) -> KafkaRecord {
        KafkaRecord {
            value: self.value.clone(),
            ..self.clone_meta()
        }
    }

    /// The same record's metadata without its value (for plugin outputs).
    fn clone_meta(&self) -> KafkaRecord {
        KafkaRecord {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: self.key.clone(),
            value: None,
        }
    }
}
