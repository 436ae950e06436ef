//! Floe SDK: write transform plugins for the Floe agent in Rust.
//!
//! A plugin is a type implementing [`Transform`] plus one [`export_transform!`] line.
//! It is built as a WebAssembly component with plain
//! `cargo build --target wasm32-wasip2 --release` and named in a pipeline's config:
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "plugins/dist/keep_paid.wasm"
//! with = { field = "paid" }
//! ```
//!
//! # Records
//!
//! The agent decodes each Kafka message before the chain and hands a plugin a
//! [`Record`]: the value as a JSON object (`serde_json::Map`) and the Kafka
//! [`Metadata`] (topic, partition, offset, timestamp, key). A plugin returns zero
//! records (filter), one (map) or several (flat-map), each optionally routed to a named
//! output stream (each stream is written to its own table), or an error for that record
//! alone. Records cross into the plugin in batches; the SDK calls [`Transform::process`]
//! once per record.
//!
//! ## The record representation by source format
//!
//! JSON messages arrive as they were produced. Avro messages (`format = "avro"`, with a
//! schema registry or a schema file) are decoded with their writer schema and arrive as
//! JSON with one fixed mapping per Avro type, chosen so that the text is exact and that a
//! value passed through unchanged lands in the column type the Avro schema declares:
//!
//! | Avro type | JSON the plugin sees | Example |
//! |---|---|---|
//! | `null` | `null` | `null` |
//! | `boolean` | boolean | `true` |
//! | `int`, `long` | number | `42` |
//! | `float`, `double` | number; NaN and infinities as the strings `"NaN"`, `"inf"`, `"-inf"` | `1.5` |
//! | `string` | string | `"abc"` |
//! | `bytes`, `fixed` | lowercase hex string | `"00ff10"` |
//! | `enum` | the symbol | `"GREEN"` |
//! | `decimal` (bytes or fixed) | exact decimal string with `scale` fraction digits | `"-123.45"` |
//! | `uuid` | canonical hyphenated string | `"5f0c6f2e-8d7a-4a1b-9c3e-0b1d2e3f4a5b"` |
//! | `date` | `YYYY-MM-DD` | `"2024-01-02"` |
//! | `time-millis`, `time-micros` | `HH:MM:SS.ffffff` | `"03:04:05.123000"` |
//! | `timestamp-millis`, `timestamp-micros` | ISO-8601 UTC with `Z` (6 fraction digits) | `"2024-01-02T03:04:05.123456Z"` |
//! | `local-timestamp-millis`, `local-timestamp-micros` | the same without offset | `"2024-01-02T03:04:05.123456"` |
//! | `timestamp-nanos`, `local-timestamp-nanos` | number (nanoseconds since the epoch) | `1704164645123456789` |
//! | `duration` | hex of its 12 bytes | `"010000000200000003000000"` |
//! | `record` | object, fields in schema order | `{"x": 7}` |
//! | `array` | array | `[1, 2]` |
//! | `map` | object (keys sorted) | `{"a": 0.5}` |
//! | union `[null, T]` | the value of `T`, or `null` | `"abc"` |
//! | other unions | `{"<branch>": value}` (branch: record/enum/fixed simple name, else the type name) | `{"long": 9}` |
//!
//! Keys: with `key_format = "json"` or `"avro"` the key is decoded the same way and
//! [`Metadata::key`] holds the UTF-8 bytes of its JSON text (a string key as the plain
//! string). The full Avro -> Iceberg table is in `docs/types.md`.
//!
//! # Example: a filter
//!
//! ```
//! use floe_sdk::{Config, Emit, Record, Transform, Value};
//!
//! struct KeepPaid {
//!     field: String,
//! }
//!
//! impl Transform for KeepPaid {
//!     fn init(config: &Config) -> Result<Self, String> {
//!         Ok(KeepPaid { field: config.str_or("field", "paid")?.to_string() })
//!     }
//!
//!     fn process(&mut self, record: Record) -> Result<Vec<Emit>, String> {
//!         let paid = record.value.get(&self.field) == Some(&Value::Bool(true));
//!         Ok(if paid { vec![Emit::new(record.value)] } else { vec![] })
//!     }
//! }
//!
//! floe_sdk::export_transform!(KeepPaid);
//!
//! // Plugins are tested natively, no WebAssembly build needed:
//! let mut t = floe_sdk::testing::Harness::<KeepPaid>::new(serde_json::json!({})).unwrap();
//! assert_eq!(t.run(serde_json::json!({"paid": true})).unwrap().len(), 1);
//! assert!(t.run(serde_json::json!({"paid": false})).unwrap().is_empty());
//! ```
//!
//! # Nested fields
//!
//! [`path::FieldPath`] parses a dotted path such as `user.address.city` once (in
//! [`Transform::init`]) and reads, changes, removes or writes the value it names in
//! each record, keeping the key order of the record.
//!
//! # Sandbox
//!
//! A plugin has no file system, no network and a frozen clock unless the pipeline
//! grants one; [`log`] writes to the agent's log. Fuel (instructions per batch) and
//! memory are limited per plugin by the agent's config. A panic is reported by the
//! agent with its message.

// Lets generated code name this crate by its public path, inside and outside it.
extern crate self as floe_sdk;

pub use serde;
pub use serde_json::{self, Map, Value, json};

pub mod log;
pub mod path;
pub mod testing;

#[doc(hidden)]
pub mod __export;

/// Kafka metadata of a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Topic the message was read from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Message timestamp in milliseconds since the Unix epoch, if known.
    pub timestamp_ms: Option<i64>,
    /// Message key bytes, if any.
    pub key: Option<Vec<u8>>,
}

/// A record going into a transform.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The message value (or the previous plugin's output) as a JSON object.
    pub value: Map<String, Value>,
    /// Where the message came from.
    pub metadata: Metadata,
}

/// A record coming out of a transform.
#[derive(Debug, Clone, PartialEq)]
pub struct Emit {
    /// The output value; becomes a row.
    pub value: Map<String, Value>,
    /// Output stream; `None` keeps the stream of the input (the pipeline's table by default).
    pub route: Option<String>,
}

impl Emit {
    /// An output on the input's stream.
    pub fn new(value: Map<String, Value>) -> Emit {
        Emit { value, route: None }
    }

    /// An output routed to the stream `route`.
    pub fn to(route: impl Into<String>, value: Map<String, Value>) -> Emit {
        Emit {
            value,
            route: Some(route.into()),
        }
    }
}

/// The plugin's `with` table from the pipeline config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config(pub Value);

impl Config {
    /// Deserializes the whole table into a type of the plugin's own.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        let value = if self.0.is_null() {
            Value::Object(Map::new())
        } else {
            self.0.clone()
        };
        serde_json::from_value(value).map_err(|e| format!("invalid plugin config: {e}"))
    }

    /// A string setting, or `default` when absent.
    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(format!(
                "plugin config `{name}` must be a string, got {other}"
            )),
        }
    }

    /// A required string setting.
    pub fn str(&self, name: &str) -> Result<&str, String> {
        match self.0.get(name) {
            Some(Value::String(s)) => Ok(s),
            None | Some(Value::Null) => Err(format!("plugin config `{name}` is required")),
            Some(other) => Err(format!(
                "plugin config `{name}` must be a string, got {other}"
            )),
        }
    }
}

/// A transform plugin.
pub trait Transform: Sized + 'static {
    /// Builds the plugin from its config; an error stops the pipeline at startup.
    fn init(config: &Config) -> Result<Self, String>;

    /// Transforms one record. `Ok(vec![])` drops it; `Err` sends it to the pipeline's
    /// error policy (dead-letter by default) without affecting other records.
    fn process(&mut self, record: Record) -> Result<Vec<Emit>, String>;
}

/// One output in wire form: JSON bytes and route.
#[doc(hidden)]
pub type WireOutput = (Vec<u8>, Option<String>);

/// The path every record takes through a plugin, natively and in WebAssembly alike:
/// JSON bytes in, JSON bytes out.
#[doc(hidden)]
pub fn process_bytes<T: Transform>(
    plugin: &mut T,
    value: &[u8],
    metadata: Metadata,
) -> Result<Vec<WireOutput>, String> {
    let value = match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err("input is not a JSON object".to_string()),
        Err(e) => return Err(format!("input is not valid JSON: {e}")),
    };
    let emitted = plugin.process(Record { value, metadata })?;
    emitted
        .into_iter()
        .map(|e| {
            let bytes = serde_json::to_vec(&e.value)
                .map_err(|err| format!("cannot serialize output: {err}"))?;
            Ok((bytes, e.route))
        })
        .collect()
}

/// Builds a plugin from its config in JSON text (what the agent passes to `init`).
#[doc(hidden)]
pub fn init_from_json<T: Transform>(config: &str) -> Result<T, String> {
    let value: Value = if config.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(config).map_err(|e| format!("plugin config is not JSON: {e}"))?
    };
    T::init(&Config(value))
}

/// Exports a [`Transform`] as the plugin's entry points. Use once per plugin crate.
///
/// On `wasm32` this generates the component exports; natively it expands to nothing,
/// so the same crate builds and tests with plain `cargo test`.
#[macro_export]
macro_rules! export_transform {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::__export::bindings::floe_plugin::transform::types::{Input, Outcome};

            ::std::thread_local! {
                static INSTANCE: ::std::cell::RefCell<Option<$plugin>> = const { ::std::cell::RefCell::new(None) };
            }

            struct FloeGuest;

            impl $crate::__export::bindings::Guest for FloeGuest {
                fn init(config: String) -> Result<(), String> {
                    $crate::__export::install_panic_hook();
                    let plugin = $crate::init_from_json::<$plugin>(&config)?;
                    INSTANCE.with(|i| *i.borrow_mut() = Some(plugin));
                    Ok(())
                }

                fn process(batch: Vec<Input>) -> Vec<Outcome> {
                    INSTANCE.with(|i| {
                        let mut guard = i.borrow_mut();
                        match guard.as_mut() {
                            Some(plugin) => $crate::__export::process_batch(plugin, batch),
                            None => batch.iter().map(|_| Outcome::Error("plugin used before init".to_string())).collect(),
                        }
                    })
                }
            }

            $crate::__export::bindings::__export_floe_guest!(FloeGuest with_types_in $crate::__export::bindings);
        };
    };
}
