//! What a plugin instance may touch, and what it leaves in the agent's log.
//!
//! - WASI with no preopened directories, no sockets, no name lookups and no
//!   environment variables or arguments.
//! - Clocks frozen at zero unless `allow_clock`; sleeping and waiting on a clock
//!   return at once in every case, so no host call can block a plugin (a busy wait on
//!   a granted clock is stopped by the call's deadline).
//! - Random numbers from a generator seeded from the batch unless `allow_random`: a
//!   replay of the same records gives the same numbers.
//! - stdout and stderr are captured, at most [`CAPTURE_BYTES`] per stream and call,
//!   and written to the log line by line with the plugin's name; never to the
//!   agent's own stdout.
//! - `log` lines are sanitised (control characters escaped, so a message cannot forge
//!   a log line), cut at [`LOG_LINE_BYTES`], and limited to [`LOG_LINES`] per call.
//! - A panic is only reported from the `panicked` host call, which traps: a log line
//!   cannot pose as one.
//! - The call's deadline and the agent's shutdown are checked at every epoch tick.
//! - `sha256` hashes in native code: it reads only the bytes it is given.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng as _, SeedableRng as _};
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{ResourceLimiter, StoreContextMut, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult, subscribe};
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

use super::TransformConfig;

wasmtime::component::bindgen!({
    world: "transform",
    path: "../sdk/wit/transform.wit",
    imports: { "floe-plugin:transform/host.panicked": trappable },
});

pub(crate) use floe_plugin::transform::host::Level;

/// Bytes of stdout (and of stderr) kept per call; the rest is counted, not logged.
pub const CAPTURE_BYTES: usize = 16 * 1024;
/// `log` lines written per call; the rest are counted, not written.
pub const LOG_LINES: u32 = 200;
/// Bytes of one log line (or captured output line) kept; the rest is cut.
pub const LOG_LINE_BYTES: usize = 2048;
/// How often the engine's epoch advances, i.e. how often a running call's deadline
/// and the shutdown flag are checked.
pub const TICK: Duration = Duration::from_millis(10);

/// Why a call was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The call ran past its deadline.
    Timeout,
    /// The agent is shutting down.
    Shutdown,
}

/// Output captured from the plugin's stdout and stderr during one call.
#[derive(Debug, Default)]
struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped_stdout: usize,
    dropped_stderr: usize,
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Stdout,
    Stderr,
}

/// A stdout or stderr stream that appends to the instance's [`Captured`] buffers.
#[derive(Clone)]
struct Capture {
    which: Which,
    shared: Arc<Mutex<Captured>>,
}

impl Capture {
    fn append(&self, bytes: &[u8]) {
        let mut c = self.shared.lock().expect("capture lock");
        let c = &mut *c;
        let (buf, dropped) = match self.which {
            Which::Stdout => (&mut c.stdout, &mut c.dropped_stdout),
            Which::Stderr => (&mut c.stderr, &mut c.dropped_stderr),
        };
        let room = CAPTURE_BYTES.saturating_sub(buf.len());
        let keep = bytes.len().min(room);
        buf.extend_from_slice(&bytes[..keep]);
        *dropped += bytes.len() - keep;
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(1024 * 1024)
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
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

/// The random generator of a plugin without `allow_random`: reseeded before every call.
#[derive(Clone)]
struct BatchRng(Arc<Mutex<rand::rngs::StdRng>>);

impl rand::TryRng for BatchRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.0.lock().expect("rng lock").next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.lock().expect("rng lock").next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.lock().expect("rng lock").fill_bytes(dst);
        Ok(())
    }
}

/// A pollable that is always ready: what sleeps and clock waits return.
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// Per-instance host state.
pub struct HostState {
    plugin: Arc<str>,
    wasi: WasiCtx,
    table: ResourceTable,
    memory_limit: usize,
    /// The instance tried to grow its memory past the limit.
    pub memory_exceeded: bool,
    /// What the plugin reported through `panicked` (message, index in the batch).
    pub panic: Option<(String, Option<u32>)>,
    /// Why the call was stopped from outside, if it was.
    pub stopped: Option<Stop>,
    deadline: Instant,
    shutdown: Arc<AtomicBool>,
    log_lines: u32,
    logs_dropped: u32,
    captured: Arc<Mutex<Captured>>,
    rng: Option<Arc<Mutex<rand::rngs::StdRng>>>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl HostState {
    /// The state of a fresh instance of `config`'s plugin.
    pub fn new(plugin: Arc<str>, config: &TransformConfig, shutdown: Arc<AtomicBool>) -> HostState {
        let captured = Arc::new(Mutex::new(Captured::default()));
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .stdout(Capture {
                which: Which::Stdout,
                shared: captured.clone(),
            })
            .stderr(Capture {
                which: Which::Stderr,
                shared: captured.clone(),
            })
            .insecure_random_seed(0);
        if !config.allow_clock {
            wasi.wall_clock(FrozenClock).monotonic_clock(FrozenClock);
        }
        let rng = (!config.allow_random).then(|| {
            let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(0)));
            wasi.secure_random(BatchRng(rng.clone()))
                .insecure_random(BatchRng(rng.clone()));
            rng
        });
        HostState {
            plugin,
            wasi: wasi.build(),
            table: ResourceTable::new(),
            memory_limit: usize::try_from(config.limits.memory).unwrap_or(usize::MAX),
            memory_exceeded: false,
            panic: None,
            stopped: None,
            deadline: Instant::now() + config.limits.timeout,
            shutdown,
            log_lines: 0,
            logs_dropped: 0,
            captured,
            rng,
        }
    }

    /// Prepares a call: its deadline, a fresh fault record and log budget, and the
    /// random generator seeded with `seed`.
    pub fn begin_call(&mut self, timeout: Duration, seed: u64) {
        self.deadline = Instant::now() + timeout;
        self.memory_exceeded = false;
        self.panic = None;
        self.stopped = None;
        self.log_lines = 0;
        self.logs_dropped = 0;
        if let Some(rng) = &self.rng {
            *rng.lock().expect("rng lock") = rand::rngs::StdRng::seed_from_u64(seed);
        }
    }

    /// Writes what the call printed to the log, and what was dropped.
    pub fn end_call(&mut self) {
        let captured = std::mem::take(&mut *self.captured.lock().expect("capture lock"));
        let plugin = &*self.plugin;
        for (stream, bytes, dropped) in [
            ("stdout", captured.stdout, captured.dropped_stdout),
            ("stderr", captured.stderr, captured.dropped_stderr),
        ] {
            let text = String::from_utf8_lossy(&bytes);
            for line in text.lines() {
                let line = sanitize(line, LOG_LINE_BYTES);
                tracing::info!(plugin, stream, "{line}");
            }
            if dropped > 0 {
                tracing::warn!(
                    plugin,
                    stream,
                    dropped_bytes = dropped,
                    "plugin output beyond {CAPTURE_BYTES} bytes per call was not logged"
                );
            }
        }
        if self.logs_dropped > 0 {
            tracing::warn!(
                plugin,
                dropped_lines = self.logs_dropped,
                "plugin log lines beyond {LOG_LINES} per call were not written"
            );
        }
    }

    /// The epoch callback: stop the call on shutdown or past its deadline.
    fn on_tick(&mut self) -> UpdateDeadline {
        if self.shutdown.load(Ordering::Relaxed) {
            self.stopped = Some(Stop::Shutdown);
            UpdateDeadline::Interrupt
        } else if Instant::now() >= self.deadline {
            self.stopped = Some(Stop::Timeout);
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Continue(1)
        }
    }
}

/// Installs the deadline check on a store.
pub fn watch_deadline(store: &mut wasmtime::Store<HostState>) {
    store.epoch_deadline_callback(|mut ctx| Ok(ctx.data_mut().on_tick()));
}

/// `text` on one line: control characters escaped (`\n`, `\r`, `\u{1b}`...), cut after
/// `max` bytes with a note of how much was cut.
pub fn sanitize(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 16);
    for (i, c) in text.char_indices() {
        if out.len() >= max {
            let _ = write!(out, "... ({} more bytes)", text.len() - i);
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

impl floe_plugin::transform::host::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        if self.log_lines >= LOG_LINES {
            self.logs_dropped += 1;
            return;
        }
        self.log_lines += 1;
        let message = sanitize(&message, LOG_LINE_BYTES);
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn panicked(&mut self, message: String, index: Option<u32>) -> wasmtime::Result<()> {
        self.panic = Some((sanitize(&message, LOG_LINE_BYTES), index));
        Err(wasmtime::Error::msg("the plugin panicked"))
    }

    fn sha256(&mut self, data: Vec<u8>) -> (u64, u64, u64, u64) {
        use sha2::Digest as _;
        // sha2 picks the CPU's SHA instructions at run time where it has them.
        let digest = sha2::Sha256::digest(&data);
        let word =
            |i: usize| u64::from_be_bytes(digest[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        (word(0), word(1), word(2), word(3))
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

/// The WASI interface whose waits are replaced by ready pollables.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

fn ready(store: &mut StoreContextMut<'_, HostState>) -> wasmtime::Result<Resource<DynPollable>> {
    let table = &mut store.data_mut().table;
    let resource = table.push(Ready)?;
    subscribe(table, resource)
}

/// A linker with everything a plugin may import: WASI (sync), the Floe host
/// interface, and clock waits that return at once.
pub fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    floe_plugin::transform::host::add_to_linker::<_, wasmtime::component::HasSelf<HostState>>(
        &mut linker,
        |s| s,
    )?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: StoreContextMut<'_, HostState>, (_nanos,): (u64,)| Ok((ready(&mut store)?,)),
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: StoreContextMut<'_, HostState>, (_when,): (u64,)| Ok((ready(&mut store)?,)),
    )?;
    linker.allow_shadowing(false);
    Ok(linker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_output_and_log_lines_are_bounded_per_call() {
        use floe_plugin::transform::host::Host as _;
        let config: TransformConfig = toml::from_str("uses = \"x.wasm\"").unwrap();
        let mut state = HostState::new(Arc::from("p"), &config, Arc::new(AtomicBool::new(false)));
        let stdout = Capture {
            which: Which::Stdout,
            shared: state.captured.clone(),
        };
        stdout.append(&[b'x'; 10_000]);
        stdout.append(&[b'y'; 10_000]);
        {
            let c = state.captured.lock().unwrap();
            assert_eq!(c.stdout.len(), CAPTURE_BYTES);
            assert_eq!(c.dropped_stdout, 20_000 - CAPTURE_BYTES);
            assert!(c.stderr.is_empty());
        }
        for i in 0..LOG_LINES + 50 {
            state.log(Level::Trace, format!("line {i}"));
        }
        assert_eq!((state.log_lines, state.logs_dropped), (LOG_LINES, 50));
        state.end_call();
        assert!(
            state.captured.lock().unwrap().stdout.is_empty(),
            "taken at the end of the call"
        );
        state.begin_call(Duration::from_secs(1), 7);
        assert_eq!((state.log_lines, state.logs_dropped), (0, 0));
        // A panic report is kept and traps.
        assert!(state.panicked("boom\nforged".into(), Some(3)).is_err());
        assert_eq!(state.panic, Some(("boom\\nforged".to_string(), Some(3))));
    }

    #[test]
    fn sanitize_keeps_one_line() {
        assert_eq!(sanitize("plain text", 100), "plain text");
        assert_eq!(
            sanitize("a\nERROR forged\r\x1b[31m\u{2028}", 100),
            "a\\nERROR forged\\r\\u{1b}[31m\\u{2028}"
        );
        let long = "é".repeat(100);
        let cut = sanitize(&long, 10);
        assert_eq!(cut, "ééééé... (190 more bytes)");
    }
}
