//! `escape`: a test-only plugin that tries one way out of the sandbox on every record
//! and writes what it got into the record's `outcome` field (a string), so the
//! agent's sandbox tests can assert it from the table. Not shipped.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "test-escape.wasm"
//! with = { attempt = "file", path = "/etc/hostname" }
//! ```
//!
//! `attempt` (required) is one of:
//!
//! - `"file"`: reads `path` (required) and writes a file next to it; `outcome` is
//!   `"read <n> bytes"` / `"wrote"` or `"denied: <error>"` for each.
//! - `"socket"`: connects to `127.0.0.1:<port>` (required `port`); `outcome` is
//!   `"connected"` or `"denied: <error>"`.
//! - `"env"`: `outcome` is `"<n> variables, <m> arguments"` (`var` names one to read).
//! - `"clock"`: `outcome` is `"wall <seconds since the epoch> monotonic <nanoseconds elapsed across a busy loop>"`.
//! - `"random"`: `outcome` is a random `u64` from the secure source, as text.
//! - `"print"`: prints `escape stdout <offset>` to stdout and `escape stderr <offset>`
//!   followed by a forged line `\nERROR forged` to stderr, and logs
//!   `escape log <offset>` followed by `\nINFO forged by log`; `outcome` is `"printed"`.
//! - `"spoof"`: on the record whose offset is `at_offset` (required), logs
//!   `panic: spoofed` and then aborts (a trap that is not a panic); others pass.
//! - `"sleep"`: sleeps `seconds` (required); `outcome` is `"slept"`.
//! - `"flood"`: on the record whose offset is `at_offset` (required), emits `copies`
//!   copies (required) of the record; others pass unchanged.

use std::io::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use floe_sdk::{Answer, Emit, Error, Patch, Record, Transform, error};
use serde::Deserialize;

/// The `with` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    attempt: String,
    path: Option<String>,
    port: Option<u16>,
    var: Option<String>,
    seconds: Option<u64>,
    at_offset: Option<i64>,
    copies: Option<usize>,
}

/// The plugin.
#[derive(Debug)]
pub struct Escape(Config);

fn denied(e: impl std::fmt::Display) -> String {
    format!("denied: {e}")
}

impl Transform for Escape {
    type Config = Config;

    fn new(config: Config) -> Result<Self, Error> {
        let need = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(error!(
                    "escape: attempt `{}` needs `{what}`",
                    config.attempt
                ))
            }
        };
        match config.attempt.as_str() {
            "file" => need(config.path.is_some(), "path")?,
            "socket" => need(config.port.is_some(), "port")?,
            "sleep" => need(config.seconds.is_some(), "seconds")?,
            "flood" => need(
                config.at_offset.is_some() && config.copies.is_some(),
                "at_offset and copies",
            )?,
            "spoof" => need(config.at_offset.is_some(), "at_offset")?,
            "env" | "clock" | "random" | "print" => {}
            other => return Err(error!("escape: unknown attempt `{other}`")),
        }
        Ok(Escape(config))
    }

    fn process(&mut self, record: &Record<'_>) -> Result<Answer, Error> {
        let c = &self.0;
        let outcome = match c.attempt.as_str() {
            "file" => {
                let path = c.path.as_deref().unwrap_or_default();
                let read = match std::fs::read(path) {
                    Ok(bytes) => format!("read {} bytes", bytes.len()),
                    Err(e) => denied(e),
                };
                let wrote = match std::fs::write(format!("{path}.escape"), b"x") {
                    Ok(()) => "wrote".to_string(),
                    Err(e) => denied(e),
                };
                format!("{read}; {wrote}")
            }
            "socket" => match std::net::TcpStream::connect(("127.0.0.1", c.port.unwrap_or(0))) {
                Ok(_) => "connected".to_string(),
                Err(e) => denied(e),
            },
            "env" => {
                let vars = std::env::vars().count();
                let args = std::env::args().count();
                let var = c
                    .var
                    .as_deref()
                    .map(|v| format!(", {v}={:?}", std::env::var(v).ok()))
                    .unwrap_or_default();
                format!("{vars} variables, {args} arguments{var}")
            }
            "clock" => {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let start = Instant::now();
                let mut x = 0u64;
                for i in 0..100_000u64 {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
                format!("wall {wall} monotonic {}", start.elapsed().as_nanos())
            }
            "random" => getrandom::u64().map_or_else(denied, |n| n.to_string()),
            "print" => {
                println!("escape stdout {}", record.offset());
                let _ = std::io::stdout().flush();
                eprintln!("escape stderr {}\nERROR forged", record.offset());
                floe_sdk::log::warn(&format!(
                    "escape log {}\nINFO forged by log",
                    record.offset()
                ));
                "printed".to_string()
            }
            "sleep" => {
                std::thread::sleep(Duration::from_secs(c.seconds.unwrap_or(0)));
                "slept".to_string()
            }
            "spoof" => {
                if Some(record.offset()) == c.at_offset {
                    floe_sdk::log::error("panic: spoofed");
                    std::process::abort();
                }
                return Ok(Answer::UNCHANGED);
            }
            "flood" => {
                if Some(record.offset()) == c.at_offset {
                    let copies = c.copies.unwrap_or(0);
                    return Ok(vec![Emit::json(record.json()); copies].into());
                }
                return Ok(Answer::UNCHANGED);
            }
            _ => unreachable!("checked in new"),
        };
        Ok(Patch::new().set("outcome", outcome).into())
    }
}

floe_sdk::export!(Escape);

#[cfg(test)]
mod tests {
    use floe_sdk::json;
    use floe_sdk::testing::Harness;

    use super::*;

    #[test]
    fn natively_the_attempts_succeed_and_report() {
        // Outside the sandbox nothing stops the plugin: the tests in the agent show
        // what the sandbox changes.
        let mut h = Harness::<Escape>::new(json!({"attempt": "env"})).unwrap();
        let out = h.run_one(json!({"id": 1}));
        assert!(out["outcome"].as_str().unwrap().contains("variables"));
        let mut h =
            Harness::<Escape>::new(json!({"attempt": "flood", "at_offset": 0, "copies": 3}))
                .unwrap();
        assert_eq!(h.run(json!({"id": 1})).unwrap().len(), 3);
        assert_eq!(h.run(json!({"id": 2})).unwrap().len(), 1);
        let e = Harness::<Escape>::init_error(json!({"attempt": "file"}));
        assert!(e.contains("needs `path`"), "{e}");
    }
}
