//! Floe: an edge agent that ingests Kafka topics into Apache Iceberg tables, exactly once.
//!
//! # Layout
//!
//! Modules follow a record from Kafka to Iceberg; no two modules import each other
//! outside tests (`scripts/check-module-cycles.py` checks it). The Iceberg write path
//! (catalogs, commits, delete files, expiry, orphans) is the [`floe_iceberg`] crate
//! (`agent/iceberg/`), used through its root API; it does not depend on the agent.
//!
//! - [`record`]: below every stage: the Kafka [`record::Message`], topic-partition maps,
//!   the `_kafka_*` columns, JSON parsed once into a token tape ([`record::json`]), the
//!   text formats of Iceberg values ([`record::values`]) and upsert key digests.
//! - [`source`]: the Kafka consumer group (rdkafka) behind the [`source::Source`] seam;
//!   partitions are positioned from the offsets stored in the tables.
//! - [`decode`]: message bytes (JSON, Avro, Protobuf, JSON Schema; schema registry) ->
//!   a parsed JSON object, or a reason to reject it.
//! - [`transform`]: the configured chain of WebAssembly plugins (wasmtime, sandboxed).
//! - [`schema`]: admits, rejects or fails each row; infers and evolves the Iceberg schema.
//! - [`batch`]: admitted rows -> Arrow record batches, built as rows arrive.
//! - [`sink`]: the table writer (Parquet files per partition, the upsert index and its
//!   deletes), committing through [`floe_iceberg::commit`] with the per-partition fence.
//! - [`maintain`]: the maintenance schedule and compaction; snapshot expiry, orphan and
//!   metadata cleanup are [`floe_iceberg`] operations.
//! - [`dead_letter`]: where records that cannot become rows go, with their bytes.
//! - [`pipeline`]: wires the stages: an intake thread (decode -> transform -> schema ->
//!   batch) hands seals to a committer task, so reading never waits for Parquet or the
//!   catalog; [`run`] starts every pipeline of a config.
//! - [`telemetry`]: logs and Prometheus metrics. [`error`]: error classes and backoff.
//! - [`config`]: the TOML file; every stage's settings, validated all at once
//!   (`[catalogs.NAME]` is [`floe_iceberg::CatalogConfig`]). [`settings`]: the serde
//!   helpers and secret values the stages' structs share, below every stage.
//! - [`check`]: `floe check`, a dry run of every pipeline's connections and privileges
//!   (the catalog probe is `check/catalog.rs`).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = floe::config::Config::load(std::path::Path::new("examples/local.toml"))?;
//! floe::run(config, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

pub mod batch;
pub mod check;
pub mod config;
pub mod dead_letter;
pub mod decode;
pub mod error;
pub mod failpoint;
pub mod maintain;
pub mod pipeline;
pub mod probe;
pub mod record;
pub mod schema;
pub mod settings;
pub mod sink;
pub mod source;
pub mod telemetry;
pub mod transform;

use std::collections::HashMap;
use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinSet;

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum FloeError {
    /// A catalog could not be opened.
    #[error(transparent)]
    Catalog(#[from] floe_iceberg::CatalogError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    /// The WebAssembly engine could not start.
    #[error(transparent)]
    Transform(Box<transform::TransformError>),
    /// A pipeline stopped with an error (the first one, when several did).
    #[error(transparent)]
    Pipeline(#[from] pipeline::PipelineError),
}

/// Opens catalog `name`, waiting out a catalog that does not answer yet (a database or
/// a REST server that boots with the agent): one WARN per attempt, and `/readyz` names
/// the wait for every pipeline in `users`. A catalog that answers with a refusal
/// (credentials, privileges, a bad setting) fails at once. `None`: `shutdown` came
/// first.
async fn open_catalog_waiting(
    name: &str,
    config: &floe_iceberg::CatalogConfig,
    users: &[&str],
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<floe_iceberg::CatalogHandle>, FloeError> {
    let mut attempts = CATALOG_WAIT.start();
    let since = std::time::Instant::now();
    loop {
        let error = match floe_iceberg::open_catalog(name, config).await {
            Ok(c) => {
                for pipeline in users {
                    telemetry::health::recovered(pipeline);
                }
                return Ok(Some(c));
            }
            // An embedded catalog is a local file: nothing to wait for.
            Err(e)
                if e.class() == floe_iceberg::ErrorClass::Transient
                    && !matches!(config, floe_iceberg::CatalogConfig::Embedded { .. }) =>
            {
                e
            }
            Err(e) => return Err(e.into()),
        };
        let wait = attempts
            .retry_after(floe_iceberg::ErrorClass::Transient)
            .unwrap_or(std::time::Duration::from_secs(30));
        let reason = floe_iceberg::error::with_causes(&error);
        tracing::warn!(catalog = %name, waited_s = since.elapsed().as_secs(), retry_in_s = wait.as_secs(), "waiting for the catalog: {reason}");
        for pipeline in users {
            telemetry::health::transient_failure(
                pipeline,
                "catalog",
                &format!("waiting: {reason}"),
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.as_mut() => return Ok(None),
        }
    }
}

/// How long the agent waits between attempts to open a catalog that does not answer.
const CATALOG_WAIT: floe_iceberg::retry::Policy = floe_iceberg::retry::Policy::backoff(
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(30),
);

/// Runs every pipeline of `config` until `shutdown` completes (then each commits what is
/// buffered and returns). A pipeline that fails stops alone: the others keep running
/// (unless `[agent] on_pipeline_failure = "stop"`), and the call returns the first
/// error once every pipeline has ended. A panic in a pipeline is its failure, not the
/// process's.
pub async fn run(
    config: config::Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), FloeError> {
    if let Some(m) = &config.metrics {
        telemetry::install(m)?;
    }
    let writer_id = uuid::Uuid::now_v7().to_string();
    tokio::pin!(shutdown);
    let mut catalogs: HashMap<String, floe_iceberg::CatalogHandle> = HashMap::new();
    for p in &config.pipelines {
        if !catalogs.contains_key(&p.sink.catalog) {
            let users: Vec<&str> = config
                .pipelines
                .iter()
                .filter(|q| q.sink.catalog == p.sink.catalog)
                .map(|q| q.name.as_str())
                .collect();
            let opened = open_catalog_waiting(
                &p.sink.catalog,
                &config.catalogs[&p.sink.catalog],
                &users,
                shutdown.as_mut(),
            )
            .await?;
            let Some(c) = opened else {
                return Ok(());
            };
            catalogs.insert(p.sink.catalog.clone(), c);
        }
    }
    // One instance of every plugin per plugin thread of its pipeline.
    let instances: usize = config
        .pipelines
        .iter()
        .map(|p| p.transforms.len() * p.transform_threads)
        .sum();
    let engine = if instances > 0 {
        let engine = transform::TransformEngine::for_transforms(
            &config.plugins,
            instances as u32,
            config.pipelines.iter().flat_map(|p| &p.transforms),
        )
        .map_err(|e| FloeError::Transform(Box::new(e)))?;
        Some(engine)
    } else {
        None
    };
    let on_failure = config.agent.on_pipeline_failure;
    let (stop_tx, stop_rx) = watch::channel(false);
    // Scheduled table maintenance (`[pipelines.sink.maintenance]`): never stops ingestion.
    let mut maintenance = JoinSet::new();
    for p in config
        .pipelines
        .iter()
        .filter(|p| p.sink.maintenance.is_some())
    {
        let catalog = catalogs[&p.sink.catalog].clone();
        maintenance.spawn(maintain::schedule(p.clone(), catalog, stop_rx.clone()));
    }
    let mut tasks = JoinSet::new();
    let mut names = HashMap::new();
    for p in config.pipelines {
        let catalog = catalogs[&p.sink.catalog].clone();
        let name = p.name.clone();
        let id = tasks
            .spawn(pipeline::run_pipeline(
                p,
                catalog,
                engine.clone(),
                writer_id.clone(),
                stop_rx.clone(),
            ))
            .id();
        names.insert(id, name);
    }
    let mut first_error = None;
    let mut stopping = false;
    while !tasks.is_empty() {
        tokio::select! {
            _ = &mut shutdown, if !stopping => {
                stopping = true;
                let _ = stop_tx.send(true);
                // A plugin call in progress is interrupted instead of delaying shutdown.
                if let Some(engine) = &engine {
                    engine.stop();
                }
            }
            Some(done) = tasks.join_next_with_id() => {
                let (name, result) = match done {
                    Ok((id, r)) => (names.get(&id).cloned().unwrap_or_default(), r),
                    Err(e) => {
                        let name = names.get(&e.id()).cloned().unwrap_or_default();
                        let error = pipeline::PipelineError::Internal {
                            pipeline: name.clone(),
                            message: format!("the pipeline task ended abnormally: {e}"),
                        };
                        (name, Err(error))
                    }
                };
                telemetry::health::pipeline_stopped(
                    &name,
                    result.as_ref().err().map(|e| e.to_string()).as_deref(),
                );
                if let Err(e) = result {
                    tracing::error!(pipeline = %name, error = %e, remaining = tasks.len(), "pipeline stopped; any other agent in its consumer group takes over its partitions");
                    first_error.get_or_insert(e);
                    if on_failure == config::OnPipelineFailure::Stop && !stopping {
                        stopping = true;
                        let _ = stop_tx.send(true);
                    }
                }
            }
        }
    }
    // A maintenance run in progress is dropped at its next await: every job is safe to
    // stop anywhere (nothing it wrote is referenced until its commit lands).
    maintenance.shutdown().await;
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
