//! One sandboxed plugin instance: instantiation with `init`, one call per batch, and
//! what a failed call was.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, Func, InstancePre};
use wasmtime::{ResourceLimiter, Store, Trap};

use super::engine::{PLUGIN_EXPORTS, TransformEngine};
use super::sandbox::{self, HostState, Stop};
use super::{TransformConfig, TransformError};

/// A plugin fault: a call that trapped, panicked or hit a limit. The chain rebuilds
/// the instance and splits the batch until the record behind it is alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Fault {
    /// Plugin name.
    pub plugin: String,
    /// What went wrong.
    pub kind: FaultKind,
    /// For a panic, the index in the call's batch of the record being processed, as
    /// the plugin reported it: a hint for splitting the batch.
    pub index: Option<u32>,
}

/// The kinds of plugin faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The call used all its fuel.
    Fuel {
        /// The configured fuel per call.
        limit: u64,
    },
    /// The instance tried to grow its memory past the limit.
    Memory {
        /// The configured limit in bytes.
        limit: u64,
    },
    /// The call ran past its deadline.
    Timeout {
        /// The configured time per call.
        limit: Duration,
    },
    /// The call returned more records or bytes than allowed.
    Output(String),
    /// A Rust panic inside the plugin (message from the SDK's panic hook).
    Panic(String),
    /// Any other trap.
    Trap(String),
    /// The plugin broke the contract (e.g. wrong number of answers).
    Contract(String),
}

impl Fault {
    /// What happened, without the plugin's name: `panicked: ...`, `exceeded its fuel
    /// limit (...)`.
    pub fn reason(&self) -> String {
        match &self.kind {
            FaultKind::Fuel { limit } => format!(
                "exceeded its fuel limit ({limit} per batch; raise limits.fuel or make it cheaper)"
            ),
            FaultKind::Memory { limit } => format!(
                "exceeded its memory limit ({} MiB; raise limits.memory)",
                limit >> 20
            ),
            FaultKind::Timeout { limit } => format!(
                "exceeded its time limit ({} per batch; raise limits.timeout or make it cheaper)",
                humantime::format_duration(*limit)
            ),
            FaultKind::Output(m) => format!("exceeded its output limit: {m}"),
            FaultKind::Panic(m) => format!("panicked: {m}"),
            FaultKind::Trap(m) => format!("trapped: {m}"),
            FaultKind::Contract(m) => format!("broke the plugin contract: {m}"),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {} {}", self.plugin, self.reason())
    }
}

/// Why a call produced nothing.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The plugin faulted; the instance is rebuilt on the next call.
    Fault(Fault),
    /// The agent is shutting down.
    Interrupted,
    /// The instance could not be rebuilt (its `init` failed).
    Fatal(TransformError),
}

struct Live {
    store: Store<HostState>,
    process: Func,
}

/// A plugin, instantiated at startup and rebuilt after a fault.
pub(crate) struct PluginInstance {
    name: Arc<str>,
    config: TransformConfig,
    engine: TransformEngine,
    pre: InstancePre<HostState>,
    live: Option<Live>,
    /// Fuel the calls used, when the engine counts it.
    fuel_used: u64,
    /// Built for contract 0.2.2 or later: its records carry their field index.
    indexed: bool,
}

impl PluginInstance {
    /// Prepares a plugin and instantiates it once, so a bad config fails at startup.
    pub fn new(
        engine: &TransformEngine,
        config: &TransformConfig,
        component: Component,
    ) -> Result<PluginInstance, TransformError> {
        let name: Arc<str> = Arc::from(config.display_name());
        let load_err = |e: wasmtime::Error| TransformError::Load {
            plugin: name.to_string(),
            uses: config.uses.clone(),
            reason: format!("cannot link: {e:#}"),
        };
        let linker = sandbox::linker(&engine.engine)
            .map_err(|e| TransformError::Engine(format!("{e:#}")))?;
        let pre = linker.instantiate_pre(&component).map_err(load_err)?;
        let indexed = component
            .component_type()
            .exports(&engine.engine)
            .any(|(name, _)| name == PLUGIN_EXPORTS[0]);
        let mut instance = PluginInstance {
            name,
            config: config.clone(),
            engine: engine.clone(),
            pre,
            live: None,
            fuel_used: 0,
            indexed,
        };
        instance.live = Some(instance.instantiate()?);
        Ok(instance)
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the plugin reads the input layout of this contract (each record with
    /// its field index) rather than that of 0.2.1 and earlier.
    pub fn indexed(&self) -> bool {
        self.indexed
    }

    fn instantiate(&self) -> Result<Live, TransformError> {
        let limits = &self.config.limits;
        let state = HostState::new(
            self.name.clone(),
            &self.config,
            self.engine.shutdown.clone(),
        );
        let mut store = Store::new(&self.engine.engine, state);
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        sandbox::watch_deadline(&mut store);
        let engine_err = |e: wasmtime::Error| TransformError::Engine(format!("{e:#}"));
        refuel(&self.engine, &mut store, limits).map_err(engine_err)?;
        store.set_epoch_deadline(1);
        store.data_mut().begin_call(limits.timeout, 0);
        let contract = |what: &str| TransformError::Contract {
            plugin: self.name.to_string(),
            reason: format!("does not export {what} (not a Floe plugin?)"),
        };
        let instance = match self.pre.instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => {
                store.data_mut().end_call();
                return Err(self.fatal(&store, e));
            }
        };
        let (interface, export) = PLUGIN_EXPORTS
            .iter()
            .find_map(|name| Some((*name, instance.get_export_index(&mut store, None, name)?)))
            .ok_or_else(|| contract(PLUGIN_EXPORTS[0]))?;
        let func = |store: &mut Store<HostState>, name: &str| {
            instance
                .get_export_index(&mut *store, Some(&export), name)
                .and_then(|i| instance.get_func(&mut *store, i))
                .ok_or_else(|| contract(&format!("{interface}#{name}")))
        };
        let init = func(&mut store, "init")?;
        let process = func(&mut store, "process")?;
        let init = init
            .typed::<(&str,), (Result<(), String>,)>(&store)
            .map_err(|e| contract(&format!("init with the contract's type ({e})")))?;
        process
            .typed::<(&[u8],), (Vec<u8>,)>(&store)
            .map_err(|e| contract(&format!("process with the contract's type ({e})")))?;
        let result = init.call(&mut store, (&self.config.with_json(),));
        store.data_mut().end_call();
        match result {
            Ok((Ok(()),)) => Ok(Live { store, process }),
            Ok((Err(reason),)) => Err(TransformError::Init {
                plugin: self.name.to_string(),
                reason: sandbox::sanitize(&reason, 4096),
            }),
            Err(e) => Err(self.fatal(&store, e)),
        }
    }

    /// A failure while instantiating: never isolated to a record.
    fn fatal(&self, store: &Store<HostState>, error: wasmtime::Error) -> TransformError {
        match self.classify(store, error) {
            CallError::Fault(f) => TransformError::Fault(f),
            CallError::Interrupted => TransformError::Interrupted {
                plugin: self.name.to_string(),
            },
            CallError::Fatal(e) => e,
        }
    }

    /// Runs one batch (an input buffer, see `sdk/wit/transform.wit`) and hands the answer
    /// buffer to `decode`, whose error is a fault too. After a fault the instance is
    /// dropped and rebuilt on the next call.
    pub fn call<R>(
        &mut self,
        input: &[u8],
        seed: u64,
        decode: impl FnOnce(&[u8]) -> Result<R, FaultKind>,
    ) -> Result<R, CallError> {
        if self.live.is_none() {
            self.live = Some(self.instantiate().map_err(|e| match e {
                TransformError::Interrupted { .. } => CallError::Interrupted,
                other => CallError::Fatal(other),
            })?);
        }
        let limits = self.config.limits;
        let live = self.live.as_mut().expect("instantiated above");
        let store = &mut live.store;
        refuel(&self.engine, store, &limits)
            .map_err(|e| CallError::Fatal(TransformError::Engine(format!("{e:#}"))))?;
        store.set_epoch_deadline(1);
        store.data_mut().begin_call(limits.timeout, seed);
        let result = live
            .process
            .typed::<(&[u8],), (Vec<u8>,)>(&*store)
            .and_then(|f| f.call(&mut *store, (input,)));
        store.data_mut().end_call();
        if self.engine.fuel
            && let Ok(left) = store.get_fuel()
        {
            self.fuel_used += fuel_per_call(&limits).saturating_sub(left);
        }
        let outcome = match result {
            Ok((answers,)) if answers.len() as u64 > limits.max_output_bytes => {
                Err(CallError::Fault(self.fault(
                    FaultKind::Output(format!(
                        "{} bytes of answers for one batch of {} bytes (limit {}; raise limits.max_output_bytes)",
                        answers.len(),
                        input.len(),
                        limits.max_output_bytes
                    )),
                    None,
                )))
            }
            Ok((answers,)) => decode(&answers).map_err(|kind| CallError::Fault(self.fault(kind, None))),
            Err(e) => {
                let live = self.live.as_ref().expect("live");
                Err(self.classify(&live.store, e))
            }
        };
        if outcome.is_err() {
            self.live = None;
        }
        outcome
    }

    /// Fuel (about one unit per WebAssembly instruction) all calls used so far; 0 when
    /// the engine does not count fuel.
    pub fn fuel_used(&self) -> u64 {
        self.fuel_used
    }

    fn fault(&self, kind: FaultKind, index: Option<u32>) -> Fault {
        Fault {
            plugin: self.name.to_string(),
            kind,
            index,
        }
    }

    /// What a failed call was, from the error and what the host saw during it.
    fn classify(&self, store: &Store<HostState>, error: wasmtime::Error) -> CallError {
        let state = store.data();
        let limits = &self.config.limits;
        let kind = match state.stopped {
            Some(Stop::Shutdown) => return CallError::Interrupted,
            Some(Stop::Timeout) => FaultKind::Timeout {
                limit: limits.timeout,
            },
            None => {
                if let Some((message, index)) = &state.panic {
                    return CallError::Fault(self.fault(FaultKind::Panic(message.clone()), *index));
                }
                if error.downcast_ref::<Trap>() == Some(&Trap::OutOfFuel) {
                    FaultKind::Fuel {
                        limit: fuel_per_call(limits),
                    }
                } else if state.memory_exceeded {
                    FaultKind::Memory {
                        limit: limits.memory,
                    }
                } else if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
                    FaultKind::Trap(format!("the plugin exited with code {}", exit.0))
                } else if let Some(trap) = error.downcast_ref::<Trap>() {
                    FaultKind::Trap(trap.to_string())
                } else {
                    FaultKind::Trap(sandbox::sanitize(&error.root_cause().to_string(), 1024))
                }
            }
        };
        CallError::Fault(self.fault(kind, None))
    }
}

/// The fuel a call starts with: `limits.fuel`, or all there is without it.
fn fuel_per_call(limits: &super::Limits) -> u64 {
    limits.fuel.unwrap_or(u64::MAX)
}

/// Fills a store's fuel for one call when the engine counts fuel (a plugin without
/// `limits.fuel` of such an engine gets all there is).
fn refuel(
    engine: &TransformEngine,
    store: &mut Store<HostState>,
    limits: &super::Limits,
) -> wasmtime::Result<()> {
    if engine.fuel {
        store.set_fuel(fuel_per_call(limits))?;
    }
    Ok(())
}
