//! One pipeline, wiring the stages in the order a record travels:
//! source -> decode -> transform -> schema -> (buffer) -> batch -> sink -> offsets.
//!
//! Records are buffered until the commit interval passes or a size threshold is hit;
//! then the buffer becomes Parquet files and one snapshot. A record leaves the buffer
//! only by being committed (or dead-lettered and synced before that commit), so the
//! offsets stored in the table never pass data that is not durable.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::Catalog;
use tokio::sync::watch;

use crate::config::PipelineConfig;
use crate::dead_letter::{DeadLetterError, DeadLetterWriter};
use crate::decode::decode_json;
use crate::offsets::OffsetMap;
use crate::schema::SchemaTracker;
use crate::sink::{CommitOutcome, SinkError, TableSink};
use crate::source::{
    KafkaRecord, KafkaSource, Positions, SourceCommand, SourceError, SourceEvent, TopicPartition,
};
use crate::transform::TransformChain;
use crate::{failpoint, telemetry};

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
}

struct Pipeline {
    config: PipelineConfig,
    sink: TableSink,
    chain: TransformChain,
    tracker: SchemaTracker,
    dead_letters: DeadLetterWriter,
    positions: Arc<Positions>,
    /// What the table stores for this pipeline.
    committed: OffsetMap,
    /// Next offset expected per partition: the end of the buffer, or `committed`.
    next: HashMap<TopicPartition, i64>,
    buffer: Vec<KafkaRecord>,
    buffer_bytes: u64,
    assigned: Vec<TopicPartition>,
    last_flush: Instant,
    last_commit: Instant,
}

/// Runs one pipeline until `shutdown` turns true or an error stops it.
pub async fn run_pipeline(
    config: PipelineConfig,
    catalog: Arc<dyn Catalog>,
    writer_id: String,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let name = config.name.clone();
    let sink_err = |source| PipelineError::Sink {
        pipeline: name.clone(),
        source: Box::new(source),
    };
    let sink = TableSink::open(catalog, &config.sink, &config.name, &writer_id)
        .await
        .map_err(sink_err)?;
    let committed = sink.stored_offsets().map_err(sink_err)?;
    let positions = Arc::new(Positions::default());
    positions.replace(committed.0.clone());
    let dead_letters =
        DeadLetterWriter::open(&config.name, &config.dead_letter).map_err(|source| {
            PipelineError::DeadLetter {
                pipeline: name.clone(),
                source: Box::new(source),
            }
        })?;
    tracing::info!(pipeline = %name, table = %sink.ident(), partitions_with_offsets = committed.0.len(), "resuming from offsets stored in the table");
    let mut source =
        KafkaSource::start(&config.name, &config.source, positions.clone()).map_err(|source| {
            PipelineError::Source {
                pipeline: name.clone(),
                source: Box::new(source),
            }
        })?;

    let mut p = Pipeline {
        tracker: sink.tracker(),
        next: committed.0.clone(),
        committed,
        sink,
        chain: TransformChain::empty(),
        dead_letters,
        positions,
        buffer: Vec::new(),
        buffer_bytes: 0,
        assigned: Vec::new(),
        last_flush: Instant::now(),
        last_commit: Instant::now(),
        config,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let result = loop {
        tokio::select! {
            _ = shutdown.changed() => {
                tracing::info!(pipeline = %name, "shutting down: committing what is buffered");
                break p.flush(&source).await;
            }
            event = source.events.recv() => {
                let step = match event {
                    Some(SourceEvent::Records(records)) => p.accept_all(records),
                    Some(SourceEvent::Assigned(tps)) => { p.assigned = tps; Ok(()) }
                    Some(SourceEvent::Revoked) => { p.discard_buffer(); Ok(()) }
                    Some(SourceEvent::Failed(reason)) => Err(PipelineError::Source { pipeline: name.clone(), source: Box::new(SourceError::Stopped(reason)) }),
                    None => Err(PipelineError::Source { pipeline: name.clone(), source: Box::new(SourceError::Stopped("channel closed".into())) }),
                };
                if let Err(e) = step { break Err(e); }
                if p.buffer_full() && let Err(e) = p.flush(&source).await { break Err(e); }
            }
            _ = tick.tick() => {
                telemetry::seconds_since_last_commit(&name, p.last_commit.elapsed().as_secs_f64());
                if p.last_flush.elapsed() >= p.config.sink.commit_interval && let Err(e) = p.flush(&source).await { break Err(e); }
            }
        }
    };
    source.shutdown();
    result
}

impl Pipeline {
    fn buffer_full(&self) -> bool {
        self.buffer_bytes >= self.config.sink.flush_bytes
            || self.buffer.len() >= self.config.sink.flush_records
    }

    fn accept_all(&mut self, records: Vec<KafkaRecord>) -> Result<(), PipelineError> {
        telemetry::records_in(&self.config.name, records.len() as u64);
        for record in records {
            self.accept(record)?;
        }
        Ok(())
    }

    /// Decode, transform and check one record, then buffer it or dead-letter it.
    fn accept(&mut self, record: KafkaRecord) -> Result<(), PipelineError> {
        let tp = (record.topic.clone(), record.partition);
        if self.next.get(&tp).is_some_and(|&n| record.offset < n) {
            // Already committed or buffered (re-delivery after a rebalance or seek).
            return Ok(());
        }
        self.next.insert(tp, record.offset + 1);
        if record
            .key
            .as_deref()
            .is_some_and(|k| std::str::from_utf8(k).is_err())
        {
            return self.dead_letter(
                &record,
                "decode",
                "message key is not UTF-8 (the _kafka_key column is a string)",
            );
        }
        if let Some(value) = &record.value {
            let decoded = match decode_json(value) {
                Ok(m) => m,
                Err(e) => return self.dead_letter(&record, "decode", &e.to_string()),
            };
            // With no plugins the chain returns the record as it is, so the original bytes stay valid.
            let transformed = self.chain.apply(decoded);
            if let Err(conflict) = self.tracker.observe(&transformed) {
                return self.dead_letter(&record, "schema", &conflict.to_string());
            }
            self.buffer_bytes += value.len() as u64;
        }
        self.buffer.push(record);
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
        self.dead_letters
            .write(record, stage, reason)
            .map_err(|source| PipelineError::DeadLetter {
                pipeline: self.config.name.clone(),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// Drops everything not yet committed; the consumer re-reads it from the stored offsets.
    fn discard_buffer(&mut self) {
        self.buffer.clear();
        self.buffer_bytes = 0;
        self.next = self.committed.0.clone();
        self.tracker = self.sink.tracker();
    }

    /// Writes the buffer as one snapshot together with the offsets it covers.
    async fn flush(&mut self, source: &KafkaSource) -> Result<(), PipelineError> {
        self.last_flush = Instant::now();
        let mut offsets = self.committed.clone();
        offsets
            .0
            .extend(self.next.iter().map(|(tp, o)| (tp.clone(), *o)));
        if offsets == self.committed {
            return Ok(());
        }
        let started = Instant::now();
        let name = self.config.name.clone();
        let sink_err = |source| PipelineError::Sink {
            pipeline: name.clone(),
            source: Box::new(source),
        };
        failpoint::hit(failpoint::BEFORE_WRITE);
        let files = if self.buffer.is_empty() {
            Vec::new()
        } else {
            self.sink
                .apply_schema(&self.tracker)
                .await
                .map_err(sink_err)?;
            self.sink.write(&self.buffer).await.map_err(sink_err)?
        };
        failpoint::hit(failpoint::AFTER_WRITE);
        self.dead_letters
            .sync()
            .map_err(|source| PipelineError::DeadLetter {
                pipeline: name.clone(),
                source: Box::new(source),
            })?;
        match self.sink.commit(files, &self.committed, &offsets).await {
            Ok(CommitOutcome::Committed { snapshot_id, files }) => {
                failpoint::hit(failpoint::AFTER_COMMIT);
                let rows = self.buffer.len();
                tracing::info!(pipeline = %name, snapshot_id, files, rows, ms = started.elapsed().as_millis() as u64, "committed");
                telemetry::records_out(&name, rows as u64);
                telemetry::committed(&name, files);
                self.positions.update(offsets.0.iter());
                self.committed = offsets;
                self.last_commit = Instant::now();
                self.buffer.clear();
                self.buffer_bytes = 0;
                self.tracker = self.sink.tracker();
                let group: Vec<_> = self
                    .assigned
                    .iter()
                    .filter_map(|tp| self.committed.0.get(tp).map(|o| (tp.clone(), *o)))
                    .collect();
                source.command(SourceCommand::CommitGroupOffsets(group));
                Ok(())
            }
            // Only dead letters since the last commit: they are synced; the offsets ride on the next snapshot.
            Ok(CommitOutcome::Empty) => Ok(()),
            Err(SinkError::Fenced(reason)) => {
                tracing::warn!(pipeline = %name, %reason, "commit fenced: reloading offsets from the table and re-reading");
                self.sink.reload().await.map_err(sink_err)?;
                self.committed = self.sink.stored_offsets().map_err(sink_err)?;
                self.positions.replace(self.committed.0.clone());
                self.discard_buffer();
                let seek = self
                    .assigned
                    .iter()
                    .map(|tp| (tp.clone(), self.committed.0.get(tp).copied()))
                    .collect();
                source.command(SourceCommand::Seek(seek));
                Ok(())
            }
            Err(e) => Err(sink_err(e)),
        }
    }
}
