//! A pipeline's plugins, run in order over batches of records.

use std::time::Instant;

use super::engine::TransformEngine;
use super::plugin::{Input, Metadata, Outcome, PluginInstance};
use super::{OnError, TransformConfig, TransformError};
use crate::record::Message;
use crate::telemetry;

/// One record coming out of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainOutput {
    /// Index of the input record it came from.
    pub origin: usize,
    /// JSON object bytes.
    pub value: Vec<u8>,
    /// Output stream; `None` is the pipeline's default table.
    pub route: Option<String>,
}

/// A record a plugin returned an error for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// Index of the input record it came from.
    pub origin: usize,
    /// The plugin.
    pub plugin: String,
    /// What the plugin said.
    pub message: String,
    /// The plugin's policy for it.
    pub policy: OnError,
}

/// What a batch produced.
#[derive(Debug, Default)]
pub struct ChainResult {
    /// Outputs of the last plugin, in input order.
    pub outputs: Vec<ChainOutput>,
    /// Record errors, by plugin policy.
    pub errors: Vec<RecordError>,
}

struct Stage {
    instance: PluginInstance,
    on_error: OnError,
    batch: usize,
}

/// The plugins of one pipeline.
#[derive(Default)]
pub struct TransformChain {
    pipeline: String,
    stages: Vec<Stage>,
}

impl TransformChain {
    /// The empty chain: records pass unchanged.
    pub fn empty() -> Self {
        TransformChain::default()
    }

    /// Loads and initialises every plugin of a pipeline.
    pub fn new(
        pipeline: &str,
        engine: &TransformEngine,
        configs: &[TransformConfig],
    ) -> Result<TransformChain, TransformError> {
        let mut stages = Vec::with_capacity(configs.len());
        for config in configs {
            let component = engine.load(config)?;
            stages.push(Stage {
                instance: PluginInstance::new(engine, config, component)?,
                on_error: config.on_error,
                batch: config.limits.batch.max(1),
            });
        }
        Ok(TransformChain {
            pipeline: pipeline.to_string(),
            stages,
        })
    }

    /// Whether there are no plugins.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Runs records (all with a value) through every plugin. A fault aborts the batch.
    pub fn run(&mut self, records: &[&Message]) -> Result<ChainResult, TransformError> {
        let mut current: Vec<ChainOutput> = records
            .iter()
            .enumerate()
            .map(|(origin, r)| ChainOutput {
                origin,
                value: r.value.clone().unwrap_or_default(),
                route: None,
            })
            .collect();
        let mut errors = Vec::new();
        for stage in &mut self.stages {
            let plugin = stage.instance.name().to_string();
            let started = Instant::now();
            let records_in = current.len();
            let mut next = Vec::with_capacity(current.len());
            for chunk in current.chunks_mut(stage.batch) {
                let inputs: Vec<Input> = chunk
                    .iter_mut()
                    .map(|c| {
                        let r = records[c.origin];
                        Input {
                            // Moved, not copied: `current` is replaced by this stage's outputs.
                            value: std::mem::take(&mut c.value),
                            metadata: Metadata {
                                topic: r.topic.to_string(),
                                partition: r.partition,
                                offset: r.offset,
                                timestamp_ms: r.timestamp_ms,
                                key: r.key.clone(),
                            },
                        }
                    })
                    .collect();
                let outcomes = match stage.instance.process(&inputs) {
                    Ok(o) => o,
                    Err(e) => {
                        telemetry::plugin_fault(&self.pipeline, &plugin);
                        return Err(e);
                    }
                };
                for (input, outcome) in chunk.iter().zip(outcomes) {
                    match outcome {
                        Outcome::Emit(outputs) => {
                            next.extend(outputs.into_iter().map(|o| ChainOutput {
                                origin: input.origin,
                                value: o.value,
                                route: o.route.or_else(|| input.route.clone()),
                            }))
                        }
                        Outcome::Error(message) => errors.push(RecordError {
                            origin: input.origin,
                            plugin: plugin.clone(),
                            message,
                            policy: stage.on_error,
                        }),
                    }
                }
            }
            telemetry::plugin_batch(
                &self.pipeline,
                &plugin,
                records_in,
                next.len(),
                started.elapsed(),
            );
            current = next;
        }
        Ok(ChainResult {
            outputs: current,
            errors,
        })
    }
}
