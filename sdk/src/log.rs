//! Logging from a plugin into the agent's log, tagged with the plugin's name.
//! Natively (in tests) lines go to stderr.
//!
//! The agent escapes control characters (a message cannot forge log lines), cuts long
//! lines and writes at most a few hundred lines per batch: log what helps an operator,
//! not every record. `println!` and `eprintln!` work too and land in the same log.

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

/// Writes one line to the agent's log.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::__export::bindings::floe_plugin::transform::host;
        let level = match level {
            Level::Trace => host::Level::Trace,
            Level::Debug => host::Level::Debug,
            Level::Info => host::Level::Info,
            Level::Warn => host::Level::Warn,
            Level::Error => host::Level::Error,
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

/// Error-level line.
pub fn error(message: &str) {
    log(Level::Error, message);
}

/// Debug-level line.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}
