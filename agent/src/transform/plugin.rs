//! One sandboxed plugin instance.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

use super::engine::TransformEngine;
use super::{TransformConfig, TransformError};

wasmtime::component::bindgen!({
    world: "transform",
    path: "../wit/transform.wit",
});

use floe_plugin::transform::types::Level;
pub use floe_plugin::transform::types::Metadata;

/// A plugin fault: the batch it happened in is not committed and the instance is rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Fault {
    /// Plugin name.
    pub plugin: String,
    /// What went wrong.
    pub kind: FaultKind,
}

/// The kinds of plugin faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The batch used all its fuel.
    Fuel {
        /// The configured fuel per batch.
        limit: u64,
    },
    /// The instance tried to grow its memory past the limit.
    Memory {
        /// The configured limit in bytes.
        limit: u64,
    },
    /// A Rust panic inside the plugin (message from the SDK's panic hook).
    Panic(String),
    /// Any other trap.
    Trap(String),
    /// The plugin broke the contract (e.g. wrong number of outcomes).
    Contract(String),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.plugin;
        match &self.kind {
            FaultKind::Fuel { limit } => write!(
                f,
                "plugin {p} exceeded its fuel limit ({limit} per batch; raise limits.fuel or make it cheaper)"
            ),
            FaultKind::Memory { limit } => write!(
                f,
                "plugin {p} exceeded its memory limit ({} MiB; raise limits.memory)",
                limit >> 20
            ),
            FaultKind::Panic(m) => write!(f, "plugin {p} panicked: {m}"),
            FaultKind::Trap(m) => write!(f, "plugin {p} trapped: {m}"),
            FaultKind::Contract(m) => write!(f, "plugin {p} broke the plugin contract: {m}"),
        }
    }
}

/// Per-instance host state: WASI (no files, no network), limits, and what the plugin logged.
struct HostState {
    plugin: Arc<str>,
    wasi: WasiCtx,
    table: ResourceTable,
    memory_limit: usize,
    memory_exceeded: bool,
    last_panic: Option<String>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl floe_plugin::transform::types::Host for HostState {}

impl floe_plugin::transform::host::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        if let Some(panic) = message.strip_prefix("panic: ") {
            self.last_panic = Some(panic.to_string());
        }
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exceeded = true;
            // An error (not `Ok(false)`) traps right here, so the plugin cannot limp on.
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes reached",
                self.memory_limit
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// Clocks for plugins that were not granted one: always zero.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A plugin, instantiated lazily and rebuilt after a fault.
pub struct PluginInstance {
    name: Arc<str>,
    config: TransformConfig,
    engine: TransformEngine,
    component: Component,
    linker: Linker<HostState>,
    live: Option<(Store<HostState>, Transform)>,
}

impl PluginInstance {
    /// Prepares a plugin and instantiates it once, so a bad config fails at startup.
    pub fn new(
        engine: &TransformEngine,
        config: &TransformConfig,
        component: Component,
    ) -> Result<PluginInstance, TransformError> {
        let name: Arc<str> = Arc::from(config.display_name());
        let mut linker = Linker::new(&engine.engine);
        let engine_err = |e: wasmtime::Error| TransformError::Engine(format!("{e:#}"));
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(engine_err)?;
        Transform::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(engine_err)?;
        let mut instance = PluginInstance {
            name,
            config: config.clone(),
            engine: engine.clone(),
            component,
            linker,
            live: None,
        };
        instance.live = Some(instance.instantiate()?);
        Ok(instance)
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn instantiate(&self) -> Result<(Store<HostState>, Transform), TransformError> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if !self.config.allow_clock {
            wasi.wall_clock(FrozenClock).monotonic_clock(FrozenClock);
        }
        let state = HostState {
            plugin: self.name.clone(),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            memory_limit: usize::try_from(self.config.limits.memory).unwrap_or(usize::MAX),
            memory_exceeded: false,
            last_panic: None,
        };
        let mut store = Store::new(&self.engine.engine, state);
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        store
            .set_fuel(self.config.limits.fuel)
            .map_err(|e| TransformError::Engine(format!("{e:#}")))?;
        let bindings = Transform::instantiate(&mut store, &self.component, &self.linker).map_err(
            |e| TransformError::Load {
                plugin: self.name.to_string(),
                uses: self.config.uses.clone(),
                reason: format!(
                    "cannot instantiate (built for another version of wit/transform.wit?): {e:#}"
                ),
            },
        )?;
        match bindings.call_init(&mut store, &self.config.with_json()) {
            Ok(Ok(())) => Ok((store, bindings)),
            Ok(Err(reason)) => Err(TransformError::Init {
                plugin: self.name.to_string(),
                reason,
            }),
            Err(e) => Err(TransformError::Fault(self.fault(&store, e))),
        }
    }

    /// Runs one batch; on a fault the instance is dropped and rebuilt on the next call.
    pub fn process(&mut self, inputs: &[Input]) -> Result<Vec<Outcome>, TransformError> {
        if self.live.is_none() {
            self.live = Some(self.instantiate()?);
        }
        let (store, bindings) = self.live.as_mut().expect("instantiated above");
        store
            .set_fuel(self.config.limits.fuel)
            .map_err(|e| TransformError::Engine(format!("{e:#}")))?;
        match bindings.call_process(&mut *store, inputs) {
            Ok(outcomes) if outcomes.len() == inputs.len() => Ok(outcomes),
            Ok(outcomes) => {
                self.live = None;
                Err(Fault {
                    plugin: self.name.to_string(),
                    kind: FaultKind::Contract(format!(
                        "returned {} outcomes for {} records",
                        outcomes.len(),
                        inputs.len()
                    )),
                }
                .into())
            }
            Err(e) => {
                let (store, _) = self.live.take().expect("live instance");
                Err(self.fault(&store, e).into())
            }
        }
    }

    fn fault(&self, store: &Store<HostState>, error: wasmtime::Error) -> Fault {
        let state = store.data();
        let kind = if error.downcast_ref::<Trap>() == Some(&Trap::OutOfFuel) {
            FaultKind::Fuel {
                limit: self.config.limits.fuel,
            }
        } else if state.memory_exceeded {
            FaultKind::Memory {
                limit: self.config.limits.memory,
            }
        } else if let Some(message) = &state.last_panic {
            FaultKind::Panic(message.clone())
        } else {
            FaultKind::Trap(format!("{error:#}"))
        };
        Fault {
            plugin: self.name.to_string(),
            kind,
        }
    }
}
