//! Transform stage: the config-declared chain of WebAssembly plugins.
//!
//! - `engine`: one wasmtime engine per agent (pooling allocator, fuel, epoch ticks for
//!   deadlines, on-disk cache of compiled components), the lookup of
//!   `uses = "name-or-path"` and the contract version check.
//! - `sandbox`: what a plugin instance may touch: WASI with no files, network or
//!   environment, frozen clocks and sleeps that return at once, random seeded per
//!   batch, stdout/stderr captured into the log, sanitised plugin log lines.
//! - `plugin`: one sandboxed instance of a plugin, its limits, and fault detection.
//! - `chain`: runs a batch of records through every plugin in order, applies answers,
//!   and isolates the record behind a fault by splitting the batch.
//! - `probe`: `floe check`'s plugin step; `tools`: `floe plugin new` and `floe plugin test`.
//!
//! The contract with plugins is `sdk/wit/transform.wit` (`floe-plugin:transform@0.2.2`;
//! plugins built for 0.2.1 and 0.2.0 load too, and get their records without the field
//! index): one buffer of records per batch into the plugin, one buffer of answers out; each
//! record is answered unchanged, dropped, patched (fields set or removed), replaced by
//! new objects (flat-map), each optionally routed to a named stream, or an error for
//! that record alone. A record error follows the plugin's `on_error` policy. A trap, a
//! panic or a limit hit is a *fault*: the instance is rebuilt and the batch split and
//! retried until the record behind it is alone; that record then follows `on_error`
//! with the fault as its message. Only faults that cannot be pinned on one record
//! (`init` fails, or `max_consecutive_faults` records in a row fault alone) stop the
//! chain with [`TransformError::Fault`].

mod chain;
mod engine;
mod plugin;
pub mod probe;
mod sandbox;
pub mod tools;

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use chain::{
    ChainInput, ChainOutput, ChainResult, Produced, RecordError, Releaser, TransformChain,
};
pub use engine::{CacheDirError, ContractError, PluginsConfig, TransformEngine};
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
    /// The plugin's own settings, passed to its `init` as JSON (the plugin deserializes
    /// them into its config type).
    #[serde(default = "empty_table", rename = "with")]
    /// May hold credentials: `Debug` shows its keys only.
    pub with: crate::settings::Redacted<toml::Value>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// What happens to a record the plugin returns an error for.
    #[serde(default)]
    pub on_error: OnError,
    /// Give the plugin the host's wall and monotonic clocks (frozen at zero otherwise).
    #[serde(default)]
    pub allow_clock: bool,
    /// Give the plugin the host's random numbers (otherwise they are seeded from the
    /// batch, so a replay of the same records gives the same numbers).
    #[serde(default)]
    pub allow_random: bool,
}

fn empty_table() -> crate::settings::Redacted<toml::Value> {
    crate::settings::Redacted(toml::Value::Table(toml::Table::new()))
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

/// Per-plugin limits (`limits = { memory = "64MiB", timeout = "5s", fuel = ... }`).
/// "Per call" is one batch into the plugin: at most `batch` records and `batch_bytes`
/// bytes of values (a single larger record goes alone).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Fuel (roughly, WebAssembly instructions) one call may use: a deterministic
    /// bound, where `timeout` is a wall-clock one. Default: none, because counting
    /// fuel slows every plugin of the agent (wasmtime meters fuel in the compiled
    /// code of every plugin once one plugin sets it).
    #[serde(default)]
    pub fuel: Option<u64>,
    /// Linear memory a plugin instance may grow to (default 64MiB).
    #[serde(
        default = "default_memory",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub memory: u64,
    /// Wall-clock time one call may take (default 5s); also how long shutdown waits
    /// for a plugin at most.
    #[serde(
        default = "default_timeout",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub timeout: Duration,
    /// Records per call (default 1024).
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Bytes of record values per call (default 4MiB).
    #[serde(
        default = "default_batch_bytes",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub batch_bytes: u64,
    /// Records one call may output (default 100000).
    #[serde(default = "default_max_outputs")]
    pub max_outputs: usize,
    /// Bytes of answers one call may return (default 32MiB).
    #[serde(
        default = "default_max_output_bytes",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub max_output_bytes: u64,
}

fn default_memory() -> u64 {
    64 * 1024 * 1024
}
fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_batch() -> usize {
    1024
}
fn default_batch_bytes() -> u64 {
    4 * 1024 * 1024
}
fn default_max_outputs() -> usize {
    100_000
}
fn default_max_output_bytes() -> u64 {
    32 * 1024 * 1024
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: None,
            memory: default_memory(),
            timeout: default_timeout(),
            batch: default_batch(),
            batch_bytes: default_batch_bytes(),
            max_outputs: default_max_outputs(),
            max_output_bytes: default_max_output_bytes(),
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
    /// The plugin is built for another version of the plugin contract.
    #[error("plugin {plugin}: {reason}")]
    Contract {
        /// Plugin name.
        plugin: String,
        /// Which version it has, which one the agent runs, and how to rebuild.
        reason: String,
    },
    /// The plugin cache directory cannot be used.
    #[error("WebAssembly engine: {0}")]
    Cache(#[from] engine::CacheDirError),
    /// The plugin file is a component, but not one of the contract this agent runs.
    #[error("plugin {plugin}: {}: {source}", .path.display())]
    Incompatible {
        /// Plugin name.
        plugin: String,
        /// The plugin file.
        path: std::path::PathBuf,
        /// Which version it has, which one the agent runs, and how to rebuild.
        source: engine::ContractError,
    },
    /// A fault that could not be pinned on one record: `init` trapped, or
    /// `max_consecutive_faults` records in a row faulted alone.
    #[error(transparent)]
    Fault(#[from] Fault),
    /// The agent is shutting down: the call was interrupted and nothing of the batch
    /// was produced.
    #[error("plugin {plugin}: interrupted by shutdown")]
    Interrupted {
        /// Plugin name.
        plugin: String,
    },
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
        assert_eq!(t.limits.timeout, Duration::from_secs(5));
        assert!(!t.allow_random && !t.allow_clock);
        let t: TransformConfig = toml::from_str("uses = \"route\"\nname = \"r1\"\non_error = \"fail\"\nallow_random = true\nlimits = { memory = \"1MiB\", fuel = 5, timeout = \"250ms\", batch_bytes = \"1KiB\", max_outputs = 7, max_output_bytes = 100 }").unwrap();
        assert_eq!(
            (
                t.limits.timeout,
                t.limits.batch_bytes,
                t.limits.max_outputs,
                t.limits.max_output_bytes,
                t.allow_random
            ),
            (Duration::from_millis(250), 1024, 7, 100, true)
        );
        assert_eq!(
            (
                t.display_name().as_str(),
                t.on_error,
                t.limits.fuel,
                t.limits.memory
            ),
            ("r1", OnError::Fail, Some(5), 1 << 20)
        );
        assert!(toml::from_str::<TransformConfig>("uses = \"x\"\non_error = \"ignore\"").is_err());
        assert!(
            toml::from_str::<TransformConfig>("uses = \"x\"\nlimits = { timeout = \"soon\" }")
                .is_err()
        );
    }

    #[test]
    fn the_contract_is_the_version_the_sdk_builds() {
        assert!(
            include_str!("../../../sdk/wit/transform.wit").contains(&format!(
                "package floe-plugin:transform@{};",
                floe_sdk::CONTRACT_VERSION
            ))
        );
        assert_eq!(
            engine::PLUGIN_EXPORTS[0],
            format!(
                "floe-plugin:transform/plugin@{}",
                floe_sdk::CONTRACT_VERSION
            )
        );
    }
}
