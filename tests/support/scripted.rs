//! The real pipeline in-process, fed by a scripted source instead of Kafka: for tests of
//! rewinds, fences, dedupe, routing and revocations, and for the benchmark's encode limit.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use floe::record::{Message, TopicPartition};
use floe::source::scripted::{Script, scripted};
use floe::source::{Assignment, SourceCommand};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A pipeline running in this process on a scripted source.
pub struct ScriptedPipeline {
    /// Drives the source.
    pub script: Script,
    stop: watch::Sender<bool>,
    handle: JoinHandle<Result<(), floe::pipeline::PipelineError>>,
}

/// One assigned partition: its number, the position it reads from, and what
/// each table of the pipeline stores for it.
pub type PartitionStart = (i32, Option<i64>, Vec<Option<i64>>);

impl ScriptedPipeline {
    /// Starts the first pipeline of the config file at `config` (its catalog opened here,
    /// its plugins loaded) with a scripted source.
    pub async fn start(config: &Path) -> Result<ScriptedPipeline> {
        ScriptedPipeline::start_on(config, None).await
    }

    /// [`ScriptedPipeline::start`] on `catalog` instead of the one the config names
    /// (a catalog with injected faults, say).
    pub async fn start_on(
        config: &Path,
        catalog: Option<floe_iceberg::CatalogHandle>,
    ) -> Result<ScriptedPipeline> {
        let config = floe::config::Config::load(config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let pipeline = config.pipelines[0].clone();
        let catalog = match catalog {
            Some(c) => c,
            None => {
                floe_iceberg::open_catalog(
                    &pipeline.sink.catalog,
                    &config.catalogs[&pipeline.sink.catalog],
                )
                .await?
            }
        };
        let engine = if pipeline.transforms.is_empty() {
            None
        } else {
            let memory = pipeline
                .transforms
                .iter()
                .map(|t| t.limits.memory)
                .max()
                .unwrap_or(0);
            Some(floe::transform::TransformEngine::new(
                &config.plugins,
                (pipeline.transforms.len() * pipeline.transform_threads) as u32,
                memory,
            )?)
        };
        let (source, script) = scripted();
        let (stop, stop_rx) = watch::channel(false);
        let handle = tokio::spawn(floe::pipeline::run_pipeline_with_source(
            pipeline,
            catalog,
            engine,
            uuid_like(),
            Box::new(source),
            stop_rx,
        ));
        Ok(ScriptedPipeline {
            script,
            stop,
            handle,
        })
    }

    /// Assigns partitions of `topic`, each at `position` with what each table stores.
    pub fn assign(&self, topic: &str, partitions: &[PartitionStart]) {
        self.script.assign(
            partitions
                .iter()
                .map(|(p, position, stored)| Assignment {
                    tp: (Arc::from(topic), *p),
                    position: *position,
                    stored: stored.clone(),
                })
                .collect(),
        );
    }

    /// Delivers messages in the current epoch.
    pub fn push(&self, messages: Vec<Message>) {
        self.script.records(messages);
    }

    /// Revokes partitions.
    pub fn revoke(&self, tps: Vec<TopicPartition>) {
        self.script.revoke(tps);
    }

    /// Waits until the pipeline took every delivered event.
    pub async fn drained(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        while self.script.pending() > 0 {
            if start.elapsed() > timeout {
                bail!(
                    "{} events still pending after {timeout:?}",
                    self.script.pending()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The seeks the pipeline asked for.
    pub fn seeks(&self) -> Vec<SourceCommand> {
        self.script
            .commands()
            .into_iter()
            .filter(|c| matches!(c, SourceCommand::Seek { .. }))
            .collect()
    }

    /// Waits for every delivered event to be taken, then stops gracefully (commits what
    /// is buffered) and returns how the pipeline ended.
    pub async fn stop(self) -> Result<Result<(), floe::pipeline::PipelineError>> {
        self.drained(Duration::from_secs(300)).await?;
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(300), self.handle)
            .await
            .context("pipeline did not stop")?
            .context("pipeline task")
    }

    /// Whether the pipeline ended by itself (an error), without stopping it.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// Messages of one partition with consecutive offsets from `first`.
pub fn messages(topic: &str, partition: i32, first: i64, values: &[Option<&str>]) -> Vec<Message> {
    let topic: Arc<str> = Arc::from(topic);
    values
        .iter()
        .enumerate()
        .map(|(i, v)| Message {
            topic: topic.clone(),
            partition,
            offset: first + i as i64,
            timestamp_ms: Some(1_700_000_000_000),
            key: None,
            value: v.map(|v| v.as_bytes().to_vec()),
            headers: Vec::new(),
        })
        .collect()
}

fn uuid_like() -> String {
    format!("test-{}", std::process::id())
}
