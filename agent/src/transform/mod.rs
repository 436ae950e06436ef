//! Transform stage: the config-declared chain of WebAssembly plugins.
//!
//! - `engine`: one wasmtime engine per agent (pooling allocator, fuel, on-disk cache of
//!   compiled components) and the lookup of `uses = "name-or-path"`.
//! - `plugin`: one sandboxed instance of a plugin, its limits, and fault detection.
//! - `chain`: runs a batch of records through every plugin in order.
//!
//! The contract with plugins is `wit/transform.wit`: records cross the boundary in
//! batches as JSON bytes with their Kafka metadata; each record yields zero, one or many
//! outputs (optionally routed to a named stream) or an error for that record alone.
//! A record error follows the plugin's `on_error` policy; a trap, a panic or a limit hit
//! is a *fault*: the batch is not committed, the instance is rebuilt, and after
//! `max_consecutive_faults` the pipeline stops.

mod chain;
mod engine;
mod plugin;
pub mod tools;

use std::path::PathBuf;

use serde::Deserialize;

pub use chain::{ChainOutput, ChainResult, RecordError, TransformChain};
pub use engine::{PluginsConfig, TransformEngine};
pub use plugin::{Fault, FaultKind};

/// One entry of `[[pipelines.transforms]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformConfig {
    /// A `.wasm` file path, or the name of a plugin found in `[plugins] path`
    /// (e.g. `"filter"` -> `<dir>/filter.wasm`).
    pub uses: String,
    /// Name used in logs, metrics and dead letters (default: the file stem of `uses`).
    pub name: Option<String>,
    /// The plugin's own settings, passed to its `init` as JSON.
    #[serde(default = "empty_table", rename = "with")]
    pub with: toml::Value,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// What happens to a record the plugin returns an error for.
    #[serde(default)]
    pub on_error: OnError,
    /// Give the plugin the host's wall and monotonic clocks (frozen at zero otherwise).
    #[serde(default)]
    pub allow_clock: bool,
}

fn empty_table() -> toml::Value {
    toml::Value::Table(toml::Table::new())
}

impl TransformConfig {
    /// The name in logs and metrics.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let p = PathBuf::from(&self.uses);
            p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| self.uses.clone())
        })
    }

    /// The `with` table as JSON text, as the plugin's `init` receives it.
    pub fn with_json(&self) -> String {
        serde_json::to_string(&self.with).expect("TOML values serialize as JSON")
    }
}

/// Per-plugin limits (`limits = { fuel = ..., memory = "64MiB" }`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Fuel (roughly, WebAssembly instructions) one batch may use (default 10 billion).
    #[serde(default = "default_fuel")]
    pub fuel: u64,
    /// Linear memory a plugin instance may grow to (default 64MiB).
    #[serde(
        default = "default_memory",
        deserialize_with = "crate::config::size::deserialize"
    )]
    pub memory: u64,
    /// Records per call into the plugin (default 1024).
    #[serde(default = "default_batch")]
    pub batch: usize,
}

fn default_fuel() -> u64 {
    10_000_000_000
}
fn default_memory() -> u64 {
    64 * 1024 * 1024
}
fn default_batch() -> usize {
    1024
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: default_fuel(),
            memory: default_memory(),
            batch: default_batch(),
        }
    }
}

/// What to do with a record a plugin returned an error for.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Write the original message to the dead-letter file, with the plugin and its message.
    #[default]
    DeadLetter,
    /// Drop the record (counted in `floe_plugin_records_failed_total{policy="drop"}`).
    Drop,
    /// Stop the pipeline.
    Fail,
}

/// Errors of the transform stage.
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    /// The plugin file could not be found or read.
    #[error("plugin {plugin}: cannot load {uses}: {reason}")]
    Load {
        /// Plugin name.
        plugin: String,
        /// The `uses` value.
        uses: String,
        /// Why.
        reason: String,
    },
    /// The WebAssembly engine could not be set up.
    #[error("WebAssembly engine: {0}")]
    Engine(String),
    /// The plugin's `init` refused its config.
    #[error("plugin {plugin}: init failed: {reason}")]
    Init {
        /// Plugin name.
        plugin: String,
        /// What the plugin said.
        reason: String,
    },
    /// The plugin trapped, panicked or hit a limit.
    #[error(transparent)]
    Fault(#[from] Fault),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transform_config_defaults_and_names() {
        let t: TransformConfig =
            toml::from_str("uses = \"plugins/filter.wasm\"\nwith = { field = \"x\", n = 2 }")
                .unwrap();
        assert_eq!(t.display_name(), "filter");
        assert_eq!(t.on_error, OnError::DeadLetter);
        assert_eq!(t.limits.memory, 64 << 20);
        let json: serde_json::Value = serde_json::from_str(&t.with_json()).unwrap();
        assert_eq!(json, serde_json::json!({"field": "x", "n": 2}));
        let t: TransformConfig = toml::from_str("uses = \"route\"\nname = \"r1\"\non_error = \"fail\"\nlimits = { memory = \"1MiB\", fuel = 5 }").unwrap();
        assert_eq!(
            (
                t.display_name().as_str(),
                t.on_error,
                t.limits.fuel,
                t.limits.memory
            ),
            ("r1", OnError::Fail, 5, 1 << 20)
        );
        assert!(toml::from_str::<TransformConfig>("uses = \"x\"\non_error = \"ignore\"").is_err());
    }
}
