//! Run a plugin natively in unit tests, through the same batch buffers the agent uses
//! in WebAssembly, with answers applied the way the agent applies them.
//!
//! ```
//! use floe_sdk::testing::{Harness, Output, object};
//! use floe_sdk::{Patch, Record, json, map};
//!
//! #[map]
//! fn tag(record: &Record) -> Patch {
//!     Patch::new().set("seen", true).remove("secret")
//! }
//!
//! let mut h = Harness::<Plugin>::new(json!({})).unwrap();
//! assert_eq!(h.run_one(json!({"a": 1, "secret": "x"})), json!({"a": 1, "seen": true}));
//! assert_eq!(
//!     h.run(json!({"a": 2})).unwrap(),
//!     vec![Output::new(object(json!({"a": 2, "seen": true})))]
//! );
//! ```

use serde_json::{Map, Value};

use crate::wire::{self, AnswerReader, InputWriter};
use crate::{Error, Metadata, Transform, init_from_json};

/// One output of a record, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The value.
    pub value: Map<String, Value>,
    /// Output stream; `None` keeps the input's stream.
    pub route: Option<String>,
}

impl Output {
    /// An output on the input's stream.
    pub fn new(value: Map<String, Value>) -> Output {
        Output { value, route: None }
    }

    /// An output routed to the stream `route`.
    pub fn to(route: impl Into<String>, value: Map<String, Value>) -> Output {
        Output {
            value,
            route: Some(route.into()),
        }
    }
}

/// How the plugin answered, as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered {
    /// Unchanged (with its route).
    Unchanged(Option<String>),
    /// Dropped.
    Dropped,
    /// Patched: the number of operations, and the outcome.
    Patched(usize, Output),
    /// Replaced by new objects.
    Emitted(Vec<Output>),
}

/// A plugin instance under test.
pub struct Harness<T: Transform> {
    plugin: T,
    offset: i64,
    buf: Vec<u8>,
}

impl<T: Transform> Harness<T> {
    /// Builds the plugin from a `with` table given as JSON (`null` is an empty table).
    pub fn new(config: Value) -> Result<Self, Error> {
        Ok(Harness {
            plugin: init_from_json::<T>(&config.to_string())?,
            offset: 0,
            buf: Vec::new(),
        })
    }

    /// The error `init` gives for `config` (panics if `init` accepts it).
    pub fn init_error(config: Value) -> String {
        match Self::new(config) {
            Ok(_) => panic!("init should fail"),
            Err(e) => e.to_string(),
        }
    }

    /// Runs one record (a JSON object) with default metadata (topic `test`,
    /// partition 0, offsets counting from 0); a record error is `Err`.
    pub fn run(&mut self, value: Value) -> Result<Vec<Output>, Error> {
        let metadata = self.next_metadata();
        self.run_with(value, metadata)
    }

    /// Runs one record that must give exactly one output on the input's stream, and
    /// returns that output (panics otherwise: a test helper).
    pub fn run_one(&mut self, value: Value) -> Value {
        let mut out = self
            .run(value)
            .unwrap_or_else(|e| panic!("the plugin returned an error: {e}"));
        assert_eq!(out.len(), 1, "expected exactly one output, got {out:?}");
        let out = out.remove(0);
        assert_eq!(out.route, None, "expected the input's stream");
        Value::Object(out.value)
    }

    /// Runs a filter's record: `true` if it is kept unchanged, `false` if dropped
    /// (panics on any other answer).
    pub fn kept(&mut self, value: Value) -> bool {
        match self.answer(value) {
            Ok(Answered::Unchanged(None)) => true,
            Ok(Answered::Dropped) => false,
            other => panic!("expected the record kept unchanged or dropped, got {other:?}"),
        }
    }

    /// Runs one record with the given metadata.
    pub fn run_with(&mut self, value: Value, metadata: Metadata) -> Result<Vec<Output>, Error> {
        let json = serde_json::to_vec(&value)?;
        self.run_raw(&json, metadata)
    }

    /// Runs one record given as JSON text, checked like the agent checks messages
    /// before the chain (only JSON objects reach a plugin).
    pub fn run_json(&mut self, json: &[u8]) -> Result<Vec<Output>, Error> {
        let metadata = self.next_metadata();
        self.run_raw(json, metadata)
    }

    /// How the plugin answers one record (to tell a patch from an unchanged record).
    pub fn answer(&mut self, value: Value) -> Result<Answered, Error> {
        let json = serde_json::to_vec(&value)?;
        let metadata = self.next_metadata();
        self.call(&json, &metadata)
    }

    fn next_metadata(&mut self) -> Metadata {
        let offset = self.offset;
        self.offset += 1;
        Metadata {
            topic: "test".into(),
            partition: 0,
            offset,
            timestamp_ms: None,
            key: None,
        }
    }

    fn run_raw(&mut self, json: &[u8], metadata: Metadata) -> Result<Vec<Output>, Error> {
        Ok(match self.call(json, &metadata)? {
            Answered::Unchanged(route) => vec![Output {
                value: object_of(json).expect("checked before the call"),
                route,
            }],
            Answered::Dropped => Vec::new(),
            Answered::Patched(_, out) => vec![out],
            Answered::Emitted(outputs) => outputs,
        })
    }

    fn call(&mut self, json: &[u8], metadata: &Metadata) -> Result<Answered, Error> {
        object_of(json)?;
        // With the field index, as the agent sends it.
        let fields = crate::json::field_spans(json);
        let mut input = InputWriter::indexed(&mut self.buf, 1, &[metadata.topic.as_str()]);
        input.push(
            json,
            metadata.key.as_deref(),
            0,
            metadata.partition,
            metadata.offset,
            metadata.timestamp_ms,
            Some(fields),
        );
        let output = crate::__export::process_batch(&mut self.plugin, &self.buf);
        let mut answers = AnswerReader::new(&output).expect("the SDK writes valid answers");
        assert_eq!(answers.count, 1, "one answer per record");
        let answer = answers
            .next_answer()
            .expect("one answer")
            .expect("the SDK writes valid answers");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(match answer {
            wire::Answer::Unchanged { route } => Answered::Unchanged(route.map(text)),
            wire::Answer::Dropped => Answered::Dropped,
            wire::Answer::Error { message } => return Err(Error::msg(text(message))),
            wire::Answer::Patch { route, ops } => {
                let count = ops.len();
                let mut value = json.to_vec();
                for op in ops {
                    value = apply(&value, op)?;
                }
                let value = object_of(&value)
                    .map_err(|e| Error::msg(format!("the patched record is not valid: {e}")))?;
                Answered::Patched(
                    count,
                    Output {
                        value,
                        route: route.map(text),
                    },
                )
            }
            wire::Answer::Emit { outputs } => Answered::Emitted(
                outputs
                    .map(|(route, json)| {
                        Ok(Output {
                            value: object_of(json).map_err(|e| {
                                Error::msg(format!(
                                    "the plugin emitted something that is not a JSON object: {e}"
                                ))
                            })?,
                            route: route.map(text),
                        })
                    })
                    .collect::<Result<_, Error>>()?,
            ),
        })
    }

    /// The plugin itself, to inspect its state.
    pub fn plugin(&mut self) -> &mut T {
        &mut self.plugin
    }
}

/// Applies one patch operation the way the agent does.
fn apply(value: &[u8], op: wire::Op<'_>) -> Result<Vec<u8>, Error> {
    let keys = |path: wire::Path<'_>| -> Result<Vec<String>, Error> {
        path.map(|k| {
            std::str::from_utf8(k)
                .map(str::to_string)
                .map_err(|_| Error::msg("a patch path is not UTF-8"))
        })
        .collect()
    };
    match op {
        wire::Op::Set { path, value: new } => {
            let keys = keys(path)?;
            serde_json::from_slice::<serde::de::IgnoredAny>(new)
                .map_err(|e| Error::msg(format!("a patch value is not valid JSON: {e}")))?;
            crate::json::set(value, keys.as_slice(), new).map_err(Error::from)
        }
        wire::Op::Remove { path } => {
            let keys = keys(path)?;
            Ok(crate::json::remove(value, keys.as_slice()).unwrap_or_else(|| value.to_vec()))
        }
        wire::Op::Rename { path, to } => {
            let keys = keys(path)?;
            let to = std::str::from_utf8(to).map_err(|_| Error::msg("a new name is not UTF-8"))?;
            Ok(crate::json::rename(value, keys.as_slice(), to).unwrap_or_else(|| value.to_vec()))
        }
    }
}

/// The JSON object in `json`, or the error the agent gives for anything else.
fn object_of(json: &[u8]) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice::<Value>(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::msg("input is not a JSON object")),
        Err(e) => Err(Error::msg(format!("input is not valid JSON: {e}"))),
    }
}

/// Shorthand: the JSON object of `value` (panics if it is not an object).
pub fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(m) => m,
        other => panic!("not a JSON object: {other}"),
    }
}
