//! Logging from a plugin into the agent's log (tagged with the plugin's name).
//! Natively (in tests) lines go to stderr.

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// Prefix the agent recognises as a panic report.
pub const PANIC_PREFIX: &str = "panic: ";

/// Writes one line to the agent's log.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::__export::bindings::floe_plugin::transform::host;
        use crate::__export::bindings::floe_plugin::transform::types::Level as L;
        let level = match level {
            Level::Trace => L::Trace,
            Level::Debug => L::Debug,
            Level::Info => L::Info,
            Level::Warn => L::Warn,
            Level::Error => L::Error,
        };
        host::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Info-level line.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Warn-level line.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Debug-level line.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

#[cfg(target_arch = "wasm32")]
pub(crate) fn panic_message(message: &str) {
    log(Level::Error, &format!("{PANIC_PREFIX}{message}"));
}
