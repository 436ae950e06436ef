//! `faulty`: a test-only plugin that misbehaves on purpose, so the agent's integration
//! tests can check how faults are contained. Not shipped.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "test-faulty.wasm"
//! [pipelines.transforms.with]
//! mode = "panic"    # required, see below
//! at_offset = 3     # optional (panic, spin, hog)
//! ```
//!
//! `mode` (required string) is one of:
//!
//! - `"ok"`: passes every record through unchanged.
//! - `"panic"`: panics with `faulty plugin panicked on purpose at offset N` (N is the
//!   record's Kafka offset) on the record whose offset equals `at_offset` (optional
//!   integer), or on every record when `at_offset` is absent. Other records pass.
//! - `"fail_every"`: returns the per-record error `faulty: rejected record N` for the
//!   records whose integer `id` field N is a multiple of `every` (required integer
//!   >= 1); records without an integer `id` and the others pass through.
//! - `"spin"`: loops forever (burning fuel, never returning) on the first record, or
//!   on the record whose offset equals `at_offset` when given.
//! - `"hog"`: allocates `bytes` (optional integer, default 512 MiB) in 1 MiB chunks,
//!   writing every byte, on the first record (or the record at `at_offset`), keeps it
//!   for the rest of the instance's life, and passes every record through. Only the
//!   first trigger allocates.
//! - `"init_error"`: `init` fails with `faulty: init refused`.
//!
//! A key that the mode does not use, or an unknown mode, fails `init`.

use std::hint::black_box;

use floe_sdk::{Answer, Error, Record, Transform, error};
use serde::Deserialize;

/// One mebibyte, the chunk size of `hog`.
const MIB: usize = 1 << 20;

/// The plugin.
#[derive(Debug)]
pub struct Faulty {
    mode: Mode,
    /// Memory kept by `hog`.
    held: Vec<Vec<u8>>,
    /// Whether `hog` has allocated already.
    hogged: bool,
    /// Records seen so far.
    seen: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Ok,
    Panic { at_offset: Option<i64> },
    FailEvery { every: i64 },
    Spin { at_offset: Option<i64> },
    Hog { bytes: u64, at_offset: Option<i64> },
}

/// The `with` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    mode: String,
    at_offset: Option<i64>,
    every: Option<i64>,
    bytes: Option<u64>,
}

const MODES: &str = "ok, panic, fail_every, spin, hog, init_error";

impl Faulty {
    /// Whether a trigger with an optional `at_offset` fires for this record.
    fn fires(&self, at_offset: Option<i64>, record: &Record) -> bool {
        match at_offset {
            Some(offset) => record.offset() == offset,
            None => self.seen == 0,
        }
    }

    /// Allocates and touches `bytes` bytes in 1 MiB chunks, keeping them.
    fn hog(&mut self, bytes: u64) {
        let mut left = usize::try_from(bytes).unwrap_or(usize::MAX);
        while left > 0 {
            let len = left.min(MIB);
            self.held.push(black_box(vec![0xA5_u8; len]));
            left -= len;
        }
        black_box(&self.held);
    }

    /// Bytes held by `hog`.
    pub fn held_bytes(&self) -> usize {
        self.held.iter().map(Vec::len).sum()
    }
}

/// Never returns, and cannot be optimised away.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

impl Transform for Faulty {
    type Config = RawConfig;

    fn new(raw: RawConfig) -> Result<Self, Error> {
        let unused = |allowed: &[&str]| -> Result<(), Error> {
            let given = [
                ("at_offset", raw.at_offset.is_some()),
                ("every", raw.every.is_some()),
                ("bytes", raw.bytes.is_some()),
            ];
            match given
                .iter()
                .find(|(name, set)| *set && !allowed.contains(name))
            {
                Some((name, _)) => Err(error!("faulty: mode `{}` does not use `{name}`", raw.mode)),
                None => Ok(()),
            }
        };
        let mode = match raw.mode.as_str() {
            "ok" => {
                unused(&[])?;
                Mode::Ok
            }
            "panic" => {
                unused(&["at_offset"])?;
                Mode::Panic {
                    at_offset: raw.at_offset,
                }
            }
            "fail_every" => {
                unused(&["every"])?;
                match raw.every {
                    Some(every) if every >= 1 => Mode::FailEvery { every },
                    Some(every) => {
                        return Err(error!("faulty: `every` must be at least 1, got {every}"));
                    }
                    None => return Err(error!("faulty: mode `fail_every` needs `every`")),
                }
            }
            "spin" => {
                unused(&["at_offset"])?;
                Mode::Spin {
                    at_offset: raw.at_offset,
                }
            }
            "hog" => {
                unused(&["at_offset", "bytes"])?;
                Mode::Hog {
                    bytes: raw.bytes.unwrap_or(512 * MIB as u64),
                    at_offset: raw.at_offset,
                }
            }
            "init_error" => return Err(error!("faulty: init refused")),
            other => {
                return Err(error!(
                    "faulty: unknown mode `{other}` (expected one of {MODES})"
                ));
            }
        };
        Ok(Faulty {
            mode,
            held: Vec::new(),
            hogged: false,
            seen: 0,
        })
    }

    fn process(&mut self, record: &Record<'_>) -> Result<Answer, Error> {
        match self.mode {
            Mode::Ok => {}
            Mode::Panic { at_offset } => {
                if at_offset.is_none_or(|offset| offset == record.offset()) {
                    panic!(
                        "faulty plugin panicked on purpose at offset {}",
                        record.offset()
                    );
                }
            }
            Mode::FailEvery { every } => {
                let id = record.get("id").and_then(|n| {
                    n.as_i64()
                        .map(i128::from)
                        .or_else(|| n.as_u64().map(i128::from))
                });
                if let Some(id) = id
                    && id.rem_euclid(i128::from(every)) == 0
                {
                    return Err(error!("faulty: rejected record {id}"));
                }
            }
            Mode::Spin { at_offset } => {
                if self.fires(at_offset, record) {
                    spin();
                }
            }
            Mode::Hog { bytes, at_offset } => {
                if !self.hogged && self.fires(at_offset, record) {
                    self.hogged = true;
                    self.hog(bytes);
                }
            }
        }
        self.seen += 1;
        Ok(Answer::UNCHANGED)
    }
}

floe_sdk::export!(Faulty);

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use floe_sdk::testing::{Harness, Output, object};
    use floe_sdk::{Metadata, Value, json};

    use super::*;

    fn faulty(config: Value) -> Harness<Faulty> {
        Harness::new(config).unwrap()
    }

    fn init_error(config: Value) -> String {
        match Harness::<Faulty>::new(config) {
            Ok(_) => panic!("init should fail"),
            Err(e) => e.to_string(),
        }
    }

    fn at(offset: i64) -> Metadata {
        Metadata {
            topic: "t".into(),
            partition: 0,
            offset,
            timestamp_ms: None,
            key: None,
        }
    }

    /// Runs a record at `offset`; returns the panic message if it panicked.
    fn panic_message(h: &mut Harness<Faulty>, offset: i64) -> Option<String> {
        match catch_unwind(AssertUnwindSafe(|| {
            h.run_with(json!({"id": offset}), at(offset))
        })) {
            Ok(result) => {
                assert_eq!(
                    result.unwrap(),
                    vec![Output::new(object(json!({"id": offset})))]
                );
                None
            }
            Err(payload) => Some(
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap(),
            ),
        }
    }

    #[test]
    fn ok_passes_through() {
        let mut h = faulty(json!({"mode": "ok"}));
        for i in 0..10 {
            let record = json!({"id": i, "nested": {"x": [i]}});
            assert_eq!(
                h.run(record.clone()).unwrap(),
                vec![Output::new(object(record))]
            );
        }
    }

    #[test]
    fn fail_every_rejects_multiples_of_every() {
        let mut h = faulty(json!({"mode": "fail_every", "every": 3}));
        for id in 0..10 {
            let result = h.run(json!({"id": id, "v": "x"}));
            if id % 3 == 0 {
                assert_eq!(
                    result.unwrap_err().to_string(),
                    format!("faulty: rejected record {id}")
                );
            } else {
                assert_eq!(
                    result.unwrap(),
                    vec![Output::new(object(json!({"id": id, "v": "x"})))]
                );
            }
        }
        assert_eq!(
            h.run(json!({"id": -6})).unwrap_err().to_string(),
            "faulty: rejected record -6"
        );
        assert_eq!(
            h.run(json!({"id": u64::MAX})).unwrap_err().to_string(),
            format!("faulty: rejected record {}", u64::MAX)
        );
        assert_eq!(h.run(json!({"id": u64::MAX - 1})).unwrap().len(), 1);
        for passing in [
            json!({}),
            json!({"id": "3"}),
            json!({"id": 3.5}),
            json!({"id": null}),
            json!({"ID": 3}),
        ] {
            assert_eq!(
                h.run(passing.clone()).unwrap(),
                vec![Output::new(object(passing))]
            );
        }
        let mut h = faulty(json!({"mode": "fail_every", "every": 1}));
        assert_eq!(
            h.run(json!({"id": 7})).unwrap_err().to_string(),
            "faulty: rejected record 7"
        );
    }

    #[test]
    fn init_error_refuses() {
        assert_eq!(
            init_error(json!({"mode": "init_error"})),
            "faulty: init refused"
        );
    }

    #[test]
    fn panic_at_offset() {
        let mut h = faulty(json!({"mode": "panic", "at_offset": 5}));
        assert_eq!(panic_message(&mut h, 4), None);
        assert_eq!(
            panic_message(&mut h, 5).as_deref(),
            Some("faulty plugin panicked on purpose at offset 5")
        );
        assert_eq!(panic_message(&mut h, 6), None);
    }

    #[test]
    fn panic_on_every_record() {
        let mut h = faulty(json!({"mode": "panic"}));
        assert_eq!(
            panic_message(&mut h, 0).as_deref(),
            Some("faulty plugin panicked on purpose at offset 0")
        );
        assert_eq!(
            panic_message(&mut h, 17).as_deref(),
            Some("faulty plugin panicked on purpose at offset 17")
        );
    }

    #[test]
    fn hog_allocates_once_and_passes_through() {
        // A small amount, natively: 2.5 MiB in three chunks.
        let bytes = 5 * MIB as u64 / 2;
        let mut h = faulty(json!({"mode": "hog", "bytes": bytes}));
        assert_eq!(
            h.run(json!({"a": 1})).unwrap(),
            vec![Output::new(object(json!({"a": 1})))]
        );
        assert_eq!(h.plugin().held_bytes() as u64, bytes);
        assert_eq!(h.plugin().held.len(), 3);
        assert!(
            h.plugin()
                .held
                .iter()
                .all(|chunk| chunk.iter().all(|b| *b == 0xA5))
        );
        assert_eq!(h.run(json!({"a": 2})).unwrap().len(), 1);
        assert_eq!(
            h.plugin().held_bytes() as u64,
            bytes,
            "only the first record allocates"
        );

        let mut h = faulty(json!({"mode": "hog", "bytes": MIB, "at_offset": 2}));
        h.run_with(json!({}), at(1)).unwrap();
        assert_eq!(h.plugin().held_bytes(), 0);
        h.run_with(json!({}), at(2)).unwrap();
        assert_eq!(h.plugin().held_bytes(), MIB);
    }

    #[test]
    fn modes_are_parsed() {
        let mode = |config: Value| Harness::<Faulty>::new(config).unwrap().plugin().mode;
        assert_eq!(
            mode(json!({"mode": "spin"})),
            Mode::Spin { at_offset: None }
        );
        assert_eq!(
            mode(json!({"mode": "spin", "at_offset": 9})),
            Mode::Spin { at_offset: Some(9) }
        );
        assert_eq!(
            mode(json!({"mode": "hog"})),
            Mode::Hog {
                bytes: 512 << 20,
                at_offset: None
            }
        );
        assert_eq!(
            mode(json!({"mode": "panic"})),
            Mode::Panic { at_offset: None }
        );
    }

    #[test]
    fn spin_does_not_fire_before_its_offset() {
        let mut h = faulty(json!({"mode": "spin", "at_offset": 100}));
        assert_eq!(h.run_with(json!({"a": 1}), at(99)).unwrap().len(), 1);
    }

    #[test]
    fn bad_config_fails_init() {
        assert!(init_error(json!({})).contains("missing field `mode`"));
        assert!(init_error(Value::Null).contains("missing field `mode`"));
        let e = init_error(json!({"mode": "explode"}));
        assert!(
            e.contains("unknown mode `explode`") && e.contains("fail_every"),
            "{e}"
        );
        assert!(init_error(json!({"mode": "fail_every"})).contains("needs `every`"));
        assert!(init_error(json!({"mode": "fail_every", "every": 0})).contains("at least 1"));
        assert!(init_error(json!({"mode": "fail_every", "every": -2})).contains("at least 1"));
        let e = init_error(json!({"mode": "ok", "at_offset": 1}));
        assert_eq!(e, "faulty: mode `ok` does not use `at_offset`");
        let e = init_error(json!({"mode": "panic", "every": 2}));
        assert_eq!(e, "faulty: mode `panic` does not use `every`");
        let e = init_error(json!({"mode": "spin", "bytes": 2}));
        assert_eq!(e, "faulty: mode `spin` does not use `bytes`");
        assert!(init_error(json!({"mode": "hog", "bytes": -1})).contains("invalid plugin config"));
        assert!(init_error(json!({"mode": "ok", "extra": 1})).contains("unknown field `extra`"));
    }
}
