//! One pipeline: the stages wired together.
//!
//! ```text
//! source thread --events--> intake thread --chunks, marks--> committer task
//!   (Kafka poll,             (decode, transform,              (Parquet files streamed,
//!    rebalances)              schema, Arrow buffers)           Iceberg commits, offsets,
//!        ^                        |   ^                        fences)
//!        +------ seek, group -----+   +--------- reports ---------+
//!                offsets                 (committed, rewind, failed)
//! ```
//!
//! - [`intake`]: reads source events and turns messages into buffered rows, one parse
//!   per record; hands a table's buffer over as a *chunk* when it fills, and every
//!   commit interval a *mark* with the offsets everything handed over covers.
//! - [`committer`]: streams chunks into open data files (row groups go to storage as
//!   they fill) and, at each mark, closes them and commits them as one snapshot per
//!   table, while the intake goes on reading. A full hand-off channel blocks the intake,
//!   whose full event channel makes the source pause its partitions.
//! - [`handoff`]: what the two tell each other.
//! - Every rewind (a fenced commit, a plugin fault) goes through the committer, so what
//!   was handed over is committed or dropped before reading starts again.
//!
//! A record leaves a buffer only by being committed (or dead-lettered and synced before
//! the mark that covers it), so the offsets stored in a table never pass data that is
//! not durable. With several tables (plugins routing records to streams), every table
//! stores the offsets it covers: reading resumes from the smallest and each table skips
//! records it already holds.

mod committer;
mod errors;
mod handoff;
mod intake;
mod lookup;
mod tables;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

pub use errors::PipelineError;

use crate::config::PipelineConfig;
use crate::dead_letter::{DeadLetterError, DeadLetterTopic, DeadLetterWriter};
use crate::decode::{Decoder, InvalidPolicy};
use crate::record::columns;
use crate::schema::{OnIncompatible, SchemaTracker, TableSchema};
use crate::sink::TableSink;
use crate::source::{KafkaSource, KnownOffsets, Source};
use crate::telemetry;
use crate::transform::{TransformChain, TransformEngine};
use floe_iceberg::CatalogHandle;

/// Runs one pipeline against Kafka until `shutdown` turns true or an error stops it.
pub async fn run_pipeline(
    config: PipelineConfig,
    catalog: CatalogHandle,
    engine: Option<TransformEngine>,
    writer_id: String,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let name = config.name.clone();
    // Registered before anything is awaited, so `/readyz` names it from the start.
    telemetry::health::pipeline_started(&name, config.sink.commit_interval);
    let map = Arc::new(tables::TableMap::new(&config));
    let tables = open_tables(&config, &map, &catalog, &writer_id).await?;
    let known: Arc<KnownOffsets> = Arc::default();
    lookup::remember(&known, &tables);
    let positions = Arc::new(lookup::TablePositions::new(
        &config,
        map.clone(),
        catalog.clone(),
        known.clone(),
    ));
    let mut waiting = shutdown.clone();
    let Some(source) = start_source(&name, &config, positions, &mut waiting).await? else {
        return Ok(());
    };
    let opener = TableOpener { catalog, writer_id };
    let run = Run { map, opener, known };
    run_with_source(config, tables, run, engine, Box::new(source), shutdown).await
}

/// How long a pipeline waits between attempts to reach brokers that are down at start.
const BROKER_WAIT: floe_iceberg::retry::Policy =
    floe_iceberg::retry::Policy::backoff(Duration::from_secs(2), Duration::from_secs(30));

/// Starts the Kafka source. Brokers that do not answer yet are waited for (an edge
/// agent often boots before its broker): one WARN per attempt, `/readyz` saying what is
/// awaited, until they answer or `shutdown` (then `None`). Everything else, such as
/// refused credentials or a missing topic, fails at once.
async fn start_source(
    name: &str,
    config: &PipelineConfig,
    positions: Arc<lookup::TablePositions>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<KafkaSource>, PipelineError> {
    let mut attempts = BROKER_WAIT.start();
    let waiting_since = std::time::Instant::now();
    loop {
        let (source_config, pipeline, lookup) =
            (config.source.clone(), name.to_string(), positions.clone());
        // The metadata request blocks for up to its timeout: off the async workers.
        let started = tokio::task::spawn_blocking(move || {
            KafkaSource::start(&pipeline, &source_config, lookup)
        })
        .await
        .map_err(|e| PipelineError::internal(name, format!("starting the source: {e}")))?;
        if *shutdown.borrow() {
            return Ok(None);
        }
        let error = match started {
            Ok(source) => {
                telemetry::health::recovered(name);
                return Ok(Some(source));
            }
            Err(e @ crate::source::SourceError::Unreachable { .. }) => e,
            Err(e) => {
                return Err(PipelineError::Source {
                    pipeline: name.to_string(),
                    source: Box::new(e),
                });
            }
        };
        let wait = attempts
            .retry_after(floe_iceberg::ErrorClass::Transient)
            .unwrap_or(Duration::from_secs(30));
        let reason = error.to_string();
        tracing::warn!(
            pipeline = %name,
            waited_s = waiting_since.elapsed().as_secs(),
            retry_in_s = wait.as_secs(),
            "waiting for the Kafka brokers: {reason}"
        );
        telemetry::health::transient_failure(name, "source", &format!("waiting: {reason}"));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => return Ok(None),
        }
    }
}

/// Runs one pipeline with any [`Source`] (in-process tests use a scripted one), on
/// catalog `catalog`.
pub async fn run_pipeline_with_source(
    config: PipelineConfig,
    catalog: CatalogHandle,
    engine: Option<TransformEngine>,
    writer_id: String,
    source: Box<dyn Source>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let map = Arc::new(tables::TableMap::new(&config));
    let tables = open_tables(&config, &map, &catalog, &writer_id).await?;
    let known: Arc<KnownOffsets> = Arc::default();
    lookup::remember(&known, &tables);
    let opener = TableOpener { catalog, writer_id };
    let run = Run { map, opener, known };
    run_with_source(config, tables, run, engine, source, shutdown).await
}

/// Opens the tables known at start (index order of `map`).
async fn open_tables(
    config: &PipelineConfig,
    map: &tables::TableMap,
    catalog: &CatalogHandle,
    writer_id: &str,
) -> Result<Vec<TableSink>, PipelineError> {
    let opener = TableOpener {
        catalog: catalog.clone(),
        writer_id: writer_id.to_string(),
    };
    let mut tables = Vec::new();
    for table in map.names() {
        tables.push(opener.open(config, &table).await?);
    }
    Ok(tables)
}

/// Opens a table of the pipeline (at start, or when a new topic gets its table).
#[derive(Clone)]
pub(crate) struct TableOpener {
    catalog: CatalogHandle,
    writer_id: String,
}

impl TableOpener {
    async fn open(&self, config: &PipelineConfig, table: &str) -> Result<TableSink, PipelineError> {
        TableSink::open(
            &self.catalog,
            &config.sink,
            table,
            &config.name,
            &self.writer_id,
        )
        .await
        .map_err(PipelineError::sink(&config.name))
    }
}

/// What the pipeline's threads share about its tables.
struct Run {
    map: Arc<tables::TableMap>,
    opener: TableOpener,
    known: Arc<KnownOffsets>,
}

async fn run_with_source(
    config: PipelineConfig,
    sinks: Vec<TableSink>,
    run: Run,
    engine: Option<TransformEngine>,
    source: Box<dyn Source>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let Run { map, opener, known } = run;
    let name = config.name.clone();
    telemetry::health::pipeline_started(&name, config.sink.commit_interval);
    let decoder = Decoder::new(&config.decode)
        .map_err(|source| PipelineError::Decode {
            pipeline: name.clone(),
            source: Box::new(source),
        })?
        .on_invalid(match config.schema.on_incompatible {
            OnIncompatible::DeadLetter => InvalidPolicy::DeadLetter,
            OnIncompatible::Fail => InvalidPolicy::Fail,
            OnIncompatible::Coerce => InvalidPolicy::Coerce,
        });
    let chain = match (&engine, config.transforms.is_empty()) {
        (_, true) => TransformChain::empty(),
        (Some(engine), false) => TransformChain::with_lanes(
            &config.name,
            engine,
            &config.transforms,
            config.transform_threads,
        )
        .map(|c| c.with_max_consecutive_faults(config.max_consecutive_faults))
        .map_err(|source| PipelineError::Transform {
            pipeline: name.clone(),
            source: Box::new(source),
        })?,
        (None, false) => {
            return Err(PipelineError::internal(
                &name,
                "plugins are configured but no WebAssembly engine was built",
            ));
        }
    };
    let dl_err = |source| PipelineError::DeadLetter {
        pipeline: name.clone(),
        source: Box::new(source),
    };
    let mut dead_letters =
        DeadLetterWriter::open(&config.name, &config.dead_letter).map_err(dl_err)?;
    if let Some(topic) = &config.dead_letter.topic {
        let producer = DeadLetterTopic::new(
            topic,
            config.source.producer_config(),
            config.source.token_source(),
        )
        .map_err(|e| {
            dl_err(DeadLetterError::Topic(format!(
                "dead-letter topic {topic}: {e}"
            )))
        })?;
        dead_letters = dead_letters.with_topic(producer);
    }
    let mut options = config.schema.options();
    // On wherever two topics can reach one table: a shared table, and a table per topic
    // under a pattern (topics whose names differ only in `.`, `-` or `_` share one).
    options.topic_column = config.sink.topic_column.unwrap_or(
        config.source.topic_pattern.is_some()
            || (!config.sink.table_per_topic() && config.source.topics.len() > 1),
    );
    options.headers_column = config.sink.headers_column;
    let options = Arc::new(options);
    let mut tables = Vec::with_capacity(sinks.len());
    for sink in &sinks {
        tables.push(intake_table(&config, sink, &options)?);
    }
    tracing::info!(pipeline = %name, tables = ?map.names(), per_topic = map.per_topic(), "starting: positions come from the offsets stored in the table(s)");

    for (field, message) in config.sink.warnings() {
        tracing::warn!(pipeline = %name, setting = %format!("sink.{field}"), "{message}");
    }
    let config = Arc::new(config);
    // A few chunks in flight: the committer encodes one while the intake fills the next.
    let (handoff_tx, handoff_rx) = mpsc::channel(2);
    let (report_tx, report_rx) = crossbeam_channel::unbounded();
    let (control_tx, control_rx) = crossbeam_channel::unbounded();
    let uncommitted: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let committer = tokio::spawn(
        committer::Committer::new(
            config.clone(),
            sinks,
            map.clone(),
            known,
            report_tx,
            uncommitted.clone(),
            shutdown.clone(),
        )
        .run(handoff_rx),
    );
    let intake = intake::Intake::new(
        config.clone(),
        intake::Stages {
            decoder,
            chain,
            dead_letters,
        },
        intake::Tables {
            tables,
            map,
            opener,
            options,
        },
        source,
        intake::Links {
            handoffs: handoff_tx,
            reports: report_rx,
            control: control_rx,
            uncommitted,
        },
    );
    let intake = tokio::task::spawn_blocking(move || intake.run());

    // Wait for a stop request or for one side to end; then let the other side finish.
    let stop = async {
        loop {
            if *shutdown.borrow() {
                return;
            }
            if shutdown.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::pin!(intake);
    tokio::pin!(stop);
    let intake_result = tokio::select! {
        _ = &mut stop => {
            tracing::info!(pipeline = %name, "shutting down: committing what is buffered");
            let _ = control_tx.send(intake::Control::Shutdown);
            (&mut intake).await
        }
        done = &mut intake => done,
    };
    let committed = committer.await;
    let intake_result =
        intake_result.map_err(|e| PipelineError::internal(&name, format!("intake thread: {e}")))?;
    let committer_result =
        committed.map_err(|e| PipelineError::internal(&name, format!("committer task: {e}")))?;
    intake_result.and(committer_result)
}

/// The intake's state of an opened table.
fn intake_table(
    config: &PipelineConfig,
    sink: &TableSink,
    options: &Arc<crate::schema::SchemaOptions>,
) -> Result<intake::IntakeTable, PipelineError> {
    let schema = sink.current_schema();
    if options.topic_column
        && schema
            .as_ref()
            .is_some_and(|s| s.field_by_name(columns::TOPIC).is_none())
    {
        tracing::warn!(pipeline = %config.name, table = %sink.ident(), "the table has no _kafka_topic column: rows are written without their topic (add the column with ALTER TABLE ... ADD COLUMN _kafka_topic string)");
    }
    let tracker = tracker_for(schema.as_deref(), options);
    Ok(intake::IntakeTable::new(
        TableSchema::new(
            tracker,
            config.schema.on_incompatible,
            sink.key_spec().cloned(),
        ),
        sink.stored_offsets()
            .map_err(PipelineError::sink(&config.name))?,
        sink.exists(),
    ))
}

/// A new tracker for a table's current schema (at start and after a rewind).
fn tracker_for(
    schema: Option<&iceberg::spec::Schema>,
    options: &Arc<crate::schema::SchemaOptions>,
) -> SchemaTracker {
    // A table that has a column gets its values whatever the setting says.
    let has = |name: &str| schema.is_some_and(|s| s.field_by_name(name).is_some());
    let (topic, headers) = (has(columns::TOPIC), has(columns::HEADERS));
    let options = if (topic && !options.topic_column) || (headers && !options.headers_column) {
        Arc::new(crate::schema::SchemaOptions {
            topic_column: options.topic_column || topic,
            headers_column: options.headers_column || headers,
            ..(**options).clone()
        })
    } else {
        options.clone()
    };
    match schema {
        Some(s) => SchemaTracker::from_table(s),
        None => SchemaTracker::new(),
    }
    .with_options(options)
}
