//! The shared wasmtime engine, plugin lookup and the contract version check.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;
use wasmtime::component::Component;
use wasmtime::{
    Cache, CacheConfig, Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig,
};

use super::{TransformConfig, TransformError};

/// The interface every plugin exports, with the contract version this agent runs
/// first and then the earlier patch versions it still loads, newest first. A patch
/// version only adds what a plugin of that version asks for, so a plugin built for an
/// earlier one runs as it did: wasmtime's linker gives its `host@0.2.0` import our
/// `host@0.2.2`, and it gets its records without the field index of 0.2.2.
pub(crate) const PLUGIN_EXPORTS: [&str; 3] = [
    "floe-plugin:transform/plugin@0.2.2",
    "floe-plugin:transform/plugin@0.2.1",
    "floe-plugin:transform/plugin@0.2.0",
];
/// The package whose interfaces name the contract version.
const CONTRACT_PACKAGE: &str = "floe-plugin:transform/";

/// `[plugins]`: where plugins are found and compiled code is cached.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// Directories searched for `uses = "name"` (as `<dir>/<name>.wasm`), after the
    /// directories in the `FLOE_PLUGIN_PATH` environment variable.
    #[serde(default = "default_path")]
    pub path: Vec<PathBuf>,
    /// Where compiled plugins are cached, so a restart does not compile them again.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
}

fn default_path() -> Vec<PathBuf> {
    vec![PathBuf::from("plugins/dist")]
}

fn default_cache_dir() -> PathBuf {
    PathBuf::from(".floe/wasm-cache")
}

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            path: default_path(),
            cache_dir: default_cache_dir(),
        }
    }
}

/// Creates `dir` readable and writable by this user only (0700), or checks that an
/// existing one is owned by this user and writable by no one else: what is in it is
/// loaded as native code into this process, so a directory another local user could
/// have written to (say, one they created first under `/tmp`) is refused.
pub fn private_cache_dir(dir: &Path) -> Result<(), CacheDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let at = |dir: &Path| dir.to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CacheDirError::Create {
            dir: at(dir),
            source,
        })?;
    let meta = std::fs::symlink_metadata(dir).map_err(|source| CacheDirError::Unreadable {
        dir: at(dir),
        source,
    })?;
    if !meta.is_dir() {
        return Err(CacheDirError::NotADirectory { dir: at(dir) });
    }
    // The owner of this process's /proc entry is its effective user.
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if me.is_some_and(|uid| uid != meta.uid()) {
        return Err(CacheDirError::OtherOwner {
            dir: at(dir),
            uid: meta.uid(),
        });
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(CacheDirError::WritableByOthers {
            dir: at(dir),
            mode: meta.permissions().mode() & 0o777,
        });
    }
    Ok(())
}

/// Why the plugin cache directory cannot be used ([`private_cache_dir`]).
#[derive(Debug, thiserror::Error)]
pub enum CacheDirError {
    /// The directory could not be created.
    #[error("cannot create plugin cache {}: {source}", .dir.display())]
    Create {
        /// The cache directory.
        dir: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The directory's metadata could not be read.
    #[error("plugin cache {}: {source}", .dir.display())]
    Unreadable {
        /// The cache directory.
        dir: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The path is not a directory.
    #[error(
        "plugin cache {} is not a directory (a symbolic link?): refused, compiled code is loaded from it",
        .dir.display()
    )]
    NotADirectory {
        /// The cache directory.
        dir: PathBuf,
    },
    /// The directory belongs to another user.
    #[error(
        "plugin cache {} belongs to another user (uid {uid}): refused, compiled code is loaded from it; use a directory of your own",
        .dir.display()
    )]
    OtherOwner {
        /// The cache directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// Other users can write to the directory.
    #[error(
        "plugin cache {} is writable by other users (mode {mode:o}): refused, compiled code is loaded from it; `chmod go-w` it",
        .dir.display()
    )]
    WritableByOthers {
        /// The cache directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Why a component is not a plugin this agent can run ([`PLUGIN_EXPORTS`]).
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// Built with a floe-sdk of another contract version.
    #[error(
        "built for the plugin contract floe-plugin:transform@{version}, but this agent runs \
         @{ours}; rebuild it with floe-sdk {sdk} (set `floe-sdk = \"{sdk}\"` in its Cargo.toml, \
         move it to #[filter], #[map], #[flat_map] or the new `Transform` trait as plugins/README.md \
         shows under \"Upgrading from floe-sdk 0.1\", then `cargo build --release --target wasm32-wasip2`)",
        ours = floe_sdk::CONTRACT_VERSION,
        sdk = sdk_requirement(),
    )]
    OtherVersion {
        /// The contract version it was built for.
        version: String,
    },
    /// Not built with floe-sdk at all.
    #[error(
        "not a Floe plugin: it does not export {} (build it with floe-sdk {})",
        PLUGIN_EXPORTS[0],
        sdk_requirement()
    )]
    NotAPlugin,
}

impl PluginsConfig {
    /// Finds the `.wasm` file a `uses` value names.
    pub fn resolve(&self, uses: &str) -> Option<PathBuf> {
        self.candidates(uses).into_iter().find(|p| p.exists())
    }

    /// Where a `uses` value is looked for, in order: a path (`/` in it) as written; a
    /// name in each directory of `FLOE_PLUGIN_PATH` and then of `path`, as `<name>.wasm`
    /// (or as written when it already ends in `.wasm`).
    pub fn candidates(&self, uses: &str) -> Vec<PathBuf> {
        if uses.contains('/') {
            return vec![PathBuf::from(uses)];
        }
        let file = match uses.ends_with(".wasm") {
            true => uses.to_string(),
            false => format!("{uses}.wasm"),
        };
        let env_dirs: Vec<PathBuf> = std::env::var_os("FLOE_PLUGIN_PATH")
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default();
        let mut out = vec![];
        if uses.ends_with(".wasm") {
            out.push(PathBuf::from(uses));
        }
        out.extend(env_dirs.iter().chain(&self.path).map(|d| d.join(&file)));
        out
    }

    /// Why `uses` names no plugin file, with every place it was looked for.
    pub fn not_found(&self, uses: &str) -> String {
        let searched: Vec<String> = self
            .candidates(uses)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!(
            "no plugin file (looked for {}; build plugins with scripts/build-plugins.sh, or set [plugins] path or FLOE_PLUGIN_PATH)",
            searched.join(", ")
        )
    }
}

/// The engine every plugin instance of the agent runs in. A background thread
/// advances its epoch every few milliseconds so that calls can be stopped at their
/// deadline or at shutdown ([`TransformEngine::stop`]).
#[derive(Clone)]
pub struct TransformEngine {
    pub(crate) engine: Engine,
    pub(crate) plugins: Arc<PluginsConfig>,
    pub(crate) shutdown: Arc<AtomicBool>,
    /// Whether plugins count fuel (see [`TransformEngine::counting_fuel`]).
    pub(crate) fuel: bool,
}

impl TransformEngine {
    /// Builds the engine: epoch deadlines, pooling allocator sized for `instances`
    /// plugin instances of at most `max_memory` bytes each, and the on-disk
    /// compilation cache. No fuel is counted (see [`TransformEngine::counting_fuel`]).
    pub fn new(
        plugins: &PluginsConfig,
        instances: u32,
        max_memory: u64,
    ) -> Result<TransformEngine, TransformError> {
        TransformEngine::build(plugins, instances, max_memory, false)
    }

    /// [`TransformEngine::new`], counting fuel when `fuel` is true: what a config
    /// needs when one of its plugins sets `limits.fuel`. Counting fuel is compiled into
    /// every plugin of the engine (wasmtime checks the counter throughout the generated
    /// code) and slows them all, so it is off unless asked for; the wall-clock
    /// `limits.timeout` bounds every call either way.
    pub fn counting_fuel(
        plugins: &PluginsConfig,
        instances: u32,
        max_memory: u64,
        fuel: bool,
    ) -> Result<TransformEngine, TransformError> {
        TransformEngine::build(plugins, instances, max_memory, fuel)
    }

    /// The engine for these plugins: `instances` instances in all, memory for the
    /// largest `limits.memory`, fuel counted when one of them sets `limits.fuel`.
    pub fn for_transforms<'a>(
        plugins: &PluginsConfig,
        instances: u32,
        transforms: impl IntoIterator<Item = &'a TransformConfig>,
    ) -> Result<TransformEngine, TransformError> {
        let (mut max_memory, mut fuel) = (0, false);
        for t in transforms {
            max_memory = max_memory.max(t.limits.memory);
            fuel |= t.limits.fuel.is_some();
        }
        TransformEngine::build(plugins, instances, max_memory, fuel)
    }

    fn build(
        plugins: &PluginsConfig,
        instances: u32,
        max_memory: u64,
        fuel: bool,
    ) -> Result<TransformEngine, TransformError> {
        let engine_err = |e: wasmtime::Error| TransformError::Engine(format!("{e:#}"));
        let mut config = Config::new();
        config.consume_fuel(fuel);
        config.epoch_interruption(true);
        // `FLOE_WASM_PERFMAP=1`: name plugin functions for `perf` (/tmp/perf-PID.map).
        if std::env::var_os("FLOE_WASM_PERFMAP").is_some_and(|v| v == "1") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let mut pool = PoolingAllocationConfig::default();
        let instances = instances.max(1) * 2; // room to rebuild an instance while the old one drops
        pool.total_component_instances(instances)
            .total_core_instances(instances * 4)
            .total_memories(instances * 2)
            .total_tables(instances * 4)
            .total_stacks(instances)
            .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX));
        // `FLOE_WASM_ON_DEMAND=1`: allocate each instance's memory when it starts instead
        // of from the pool, for measuring under valgrind (callgrind counts instructions
        // exactly, whatever the other core does): the pool reserves its address space at
        // once (129 GiB for the plugin bench), which valgrind refuses.
        config.allocation_strategy(
            if std::env::var_os("FLOE_WASM_ON_DEMAND").is_some_and(|v| v == "1") {
                InstanceAllocationStrategy::OnDemand
            } else {
                InstanceAllocationStrategy::Pooling(pool)
            },
        );
        private_cache_dir(&plugins.cache_dir)?;
        let mut cache = CacheConfig::new();
        cache.with_directory(
            std::path::absolute(&plugins.cache_dir).unwrap_or_else(|_| plugins.cache_dir.clone()),
        );
        config.cache(Some(Cache::new(cache).map_err(engine_err)?));
        let engine = Engine::new(&config).map_err(engine_err)?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("floe-plugin-clock".into())
            .spawn(move || {
                // Ends once every clone of the engine (stores, components) is gone.
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(super::sandbox::TICK);
                }
            })
            .map_err(|e| TransformError::Engine(format!("cannot start the plugin clock: {e}")))?;
        Ok(TransformEngine {
            engine,
            plugins: Arc::new(plugins.clone()),
            shutdown: Arc::new(AtomicBool::new(false)),
            fuel,
        })
    }

    /// Interrupts every running plugin call of this engine at its next epoch tick, and
    /// every later one: for shutdown. The calls end with
    /// [`TransformError::Interrupted`].
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }

    /// Finds and compiles (or loads from the cache) the component of one transform.
    pub fn load(&self, transform: &TransformConfig) -> Result<Component, TransformError> {
        let plugin = transform.display_name();
        let load_err = |reason: String| TransformError::Load {
            plugin: plugin.clone(),
            uses: transform.uses.clone(),
            reason,
        };
        let path = self
            .plugins
            .resolve(&transform.uses)
            .ok_or_else(|| load_err(self.plugins.not_found(&transform.uses)))?;
        let started = std::time::Instant::now();
        let bytes =
            std::fs::read(&path).map_err(|e| load_err(format!("{}: {e}", path.display())))?;
        let bytes = if wasmparser::Parser::is_core_wasm(&bytes) {
            into_component(&bytes).map_err(|e| {
                load_err(format!(
                    "{}: cannot make a component of this core module: {e:#}",
                    path.display()
                ))
            })?
        } else {
            bytes
        };
        let component = Component::from_binary(&self.engine, &bytes)
            .map_err(|e| load_err(format!("{}: {e:#}", path.display())))?;
        check_contract(&self.engine, &component).map_err(|source| {
            TransformError::Incompatible {
                plugin: plugin.clone(),
                path: path.clone(),
                source,
            }
        })?;
        tracing::info!(plugin = %plugin, path = %path.display(), ms = started.elapsed().as_millis() as u64, "plugin loaded");
        Ok(component)
    }
}

/// Checks that a component was built for a contract this agent runs: it must export
/// one of [`PLUGIN_EXPORTS`]. A plugin built for another version says which one, and
/// how to rebuild it.
fn check_contract(engine: &Engine, component: &Component) -> Result<(), ContractError> {
    let ty = component.component_type();
    let names: Vec<String> = ty
        .exports(engine)
        .map(|(n, _)| n.to_string())
        .chain(ty.imports(engine).map(|(n, _)| n.to_string()))
        .collect();
    if names.iter().any(|n| PLUGIN_EXPORTS.contains(&n.as_str())) {
        return Ok(());
    }
    let other = names.iter().find_map(|n| {
        n.strip_prefix(CONTRACT_PACKAGE)
            .and_then(|rest| rest.split_once('@'))
            .map(|(_, version)| version.to_string())
    });
    Err(match other {
        Some(version) => ContractError::OtherVersion { version },
        None => ContractError::NotAPlugin,
    })
}

/// The floe-sdk version requirement plugins need (`0.2`).
fn sdk_requirement() -> String {
    let mut parts = floe_sdk::CONTRACT_VERSION.split('.');
    format!(
        "{}.{}",
        parts.next().unwrap_or("0"),
        parts.next().unwrap_or("0")
    )
}

/// Wraps a core module (built for `wasm32-unknown-unknown` or `wasm32-wasip1` with the
/// SDK, which embeds the component type) into a component; WASI preview 1 imports go
/// through the standard preview 1 -> preview 2 adapter.
fn into_component(module: &[u8]) -> anyhow::Result<Vec<u8>> {
    use wasi_preview1_component_adapter_provider::{
        WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    };
    let mut uses_wasi_p1 = false;
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ImportSection(imports) = payload? {
            for import in imports.into_imports() {
                uses_wasi_p1 |= import?.module == WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME;
            }
        }
    }
    let mut encoder = wit_component::ComponentEncoder::default()
        .module(module)?
        .validate(true);
    if uses_wasi_p1 {
        encoder = encoder.adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    }
    encoder.encode()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_plugin_cache_must_be_private_to_this_user() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("a/b/cache");
        private_cache_dir(&cache).unwrap();
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "created private");
        private_cache_dir(&cache).expect("an existing private directory is used");

        // Planted by someone else first: writable by all.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_cache_dir(&open).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");

        // A symbolic link to a directory elsewhere.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&cache, &link).unwrap();
        let e = private_cache_dir(&link).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");

        // Owned by another user (only root can make one here).
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        if std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).is_ok() {
            let e = private_cache_dir(&theirs).unwrap_err().to_string();
            assert!(e.contains("belongs to another user"), "{e}");
        }
    }
}
