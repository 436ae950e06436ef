//! Floe SDK: write transform plugins for the Floe agent in Rust.
//!
//! A plugin is one function with an attribute, built as a WebAssembly component with
//! plain `cargo build --target wasm32-wasip2 --release` and named in a pipeline's
//! config. The whole of a filter:
//!
//! ```
//! use floe_sdk::{Record, filter};
//!
//! #[filter]
//! fn keep_paid(record: &Record) -> bool {
//!     record.get("paid").and_then(|v| v.as_bool()) == Some(true)
//! }
//! # let mut h = floe_sdk::testing::Harness::<Plugin>::new(floe_sdk::json!({})).unwrap();
//! # assert!(h.kept(floe_sdk::json!({"paid": true})));
//! ```
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "target/wasm32-wasip2/release/keep_paid.wasm"
//! ```
//!
//! `floe plugin new NAME` creates a crate like this one, with tests and a README.
//!
//! # The shapes
//!
//! Each attribute turns a function into the plugin's entry points (and defines the
//! plugin type `Plugin`, which the [`testing::Harness`] runs natively):
//!
//! | attribute | the function returns | for each record |
//! |---|---|---|
//! | [`#[filter]`](filter) | `bool` | kept unchanged or dropped |
//! | [`#[map]`](map) | an [`Answer`], a [`Patch`], an [`Emit`] (a new object), or `Option` of those | changed, replaced, routed or dropped |
//! | [`#[flat_map]`](flat_map) | `Vec<Emit>` | replaced by any number of new objects |
//!
//! Any of them may return `Result<_, Error>` instead: an [`Error`] sends that record
//! alone to the pipeline's `on_error` policy (dead letter by default). Outputs may be
//! routed to a named stream with [`Patch::route`], [`Emit::route`] or
//! [`Answer::route`]; each stream is written to its own table.
//!
//! The function's first parameter is the [`Record`]; an optional second one is the
//! plugin's config, a type of your own deserialized from the pipeline's `with` table
//! with serde (`&C`, or `&mut C` to keep state across records):
//!
//! ```
//! use floe_sdk::{Error, Patch, Record, error, map};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Config {
//!     field: String,
//!     #[serde(default)]
//!     uppercase: bool,
//! }
//!
//! /// Trims a string field; a field that is not a string is a record error.
//! #[map]
//! fn trim(record: &Record, config: &Config) -> Result<Patch, Error> {
//!     let Some(value) = record.get(config.field.as_str()) else {
//!         return Ok(Patch::new()); // an empty patch: unchanged
//!     };
//!     let text = value.as_str().ok_or_else(|| error!("`{}` is not a string", config.field))?;
//!     let trimmed = text.trim();
//!     let out = if config.uppercase { trimmed.to_uppercase() } else { trimmed.to_string() };
//!     Ok(Patch::new().set(config.field.as_str(), out))
//! }
//!
//! # use floe_sdk::{json, testing::Harness};
//! let mut h = Harness::<Plugin>::new(json!({"field": "name", "uppercase": true})).unwrap();
//! assert_eq!(h.run_one(json!({"name": "  ann ", "id": 1})), json!({"name": "ANN", "id": 1}));
//! assert!(h.run(json!({"name": 5})).unwrap_err().to_string().contains("not a string"));
//! assert!(Harness::<Plugin>::init_error(json!({"field": "x", "typo": 1})).contains("unknown field `typo`"));
//! ```
//!
//! A config that needs checks beyond its types validates itself in a
//! `TryFrom<Raw>` conversion (`#[serde(try_from = "Raw")]`): its error fails `init`
//! with your message. The shipped plugins (`plugins/` in the Floe repository) do this.
//!
//! A flat-map emits new objects, built with serde or from pieces of the input:
//!
//! ```
//! use floe_sdk::json::ObjectWriter;
//! use floe_sdk::{Emit, Record, flat_map};
//!
//! /// One record per element of `items`, with the order's `id`.
//! #[flat_map]
//! fn explode(record: &Record) -> Vec<Emit> {
//!     let id = record.get("id");
//!     let items = record.get("items").map(|v| v.items()).into_iter().flatten();
//!     items
//!         .map(|item| {
//!             let mut out = ObjectWriter::new();
//!             if let Some(id) = id {
//!                 out.raw("order_id", id);
//!             }
//!             out.raw("item", item);
//!             Emit::json(out.finish())
//!         })
//!         .collect()
//! }
//! # use floe_sdk::{json, testing::{Harness, Output}};
//! # let mut h = Harness::<Plugin>::new(json!({})).unwrap();
//! # assert_eq!(h.run(json!({"id": 1, "items": ["a", "b"]})).unwrap().len(), 2);
//! ```
//!
//! For anything else implement [`Transform`] and [`export!`] it: the attributes are
//! shorthands for that.
//!
//! # Reading records cheaply
//!
//! A [`Record`] borrows the batch the agent sent: [`Record::get`] and
//! [`Record::fields`] find top-level fields through the field index the agent sends
//! with each record (no scanning of the text; below the top level, only the object on
//! the path is scanned, up to the field), and a [`json::Json`] value is parsed only when
//! you read it (`as_str`, `as_i64`, `to_value`, `parse`). Answers are cheap too:
//! [`Answer::UNCHANGED`] (or `true` from a filter) and a [`Patch`] let the agent keep
//! its own parsed copy of the record instead of parsing your output again. Emitting a
//! new object ([`Emit`]) costs a serialization here and a parse in the agent: prefer
//! a patch when you change a few fields. [`Record::to_map`] and [`Record::parse`]
//! parse the whole record when you need it.
//!
//! # The record representation by source format
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
//! [`Record::key`] holds the UTF-8 bytes of its JSON text (a string key as the plain
//! string). The full Avro -> Iceberg table is in `docs/types.md`.
//!
//! # Testing
//!
//! [`testing::Harness`] runs the plugin natively with `cargo test`, through the same
//! batch buffers as in WebAssembly, and applies answers the way the agent does.
//! `floe plugin test PLUGIN.wasm --input sample.ndjson` runs the built component in the
//! agent's own sandbox.
//!
//! # What a plugin may and may not do
//!
//! A plugin runs in a sandbox with limits set per plugin in the pipeline config
//! (`limits = { ... }`):
//!
//! - no file system, no network, no environment variables; the clock reads zero and
//!   sleeping returns at once unless `allow_clock = true`; random numbers are seeded
//!   from the batch (the same batch gives the same numbers on a replay) unless
//!   `allow_random = true`;
//! - stdout and stderr go to the agent's log with the plugin's name (bounded per
//!   batch), as does [`log`];
//! - [`hash::sha256`] hashes in the agent, in native code (since contract 0.2.1);
//! - each call has a wall-clock deadline (`timeout`, default 5 s), a memory cap
//!   (`memory`, default 64 MiB), caps on what it may output (`max_outputs`,
//!   `max_output_bytes`) and, when the config asks for it, fuel (`fuel`, roughly
//!   instructions: a deterministic bound);
//! - a panic, a trap or a limit hit is a fault: the agent splits the batch and retries
//!   the halves on a fresh instance until the record that causes it is alone, and that
//!   record goes to `on_error` with the fault as its reason; the others go on. A plugin
//!   that faults on record after record stops the pipeline.
//!
//! Keep no state that matters across records: after a fault the instance is rebuilt
//! from its config, and after a restart the agent replays uncommitted records.
//!
//! # Versions
//!
//! This crate's version is the version of the plugin contract it builds
//! (`wit/transform.wit`, `floe-plugin:transform@0.2.2`). A patch version of the contract
//! only adds what plugins of that version get (0.2.1 added `sha256`, see [`hash`];
//! 0.2.2 the field index sent with each record), so the agent loads plugins built for
//! an earlier patch version too and sends them what they were built for; it refuses
//! plugins built for another major.minor contract and says how to rebuild them.

// Lets generated code name this crate by its public path, inside and outside it.
extern crate self as floe_sdk;

pub use serde;
pub use serde_json::{self, Map, Value, json};

/// Turns `fn(record: &Record [, config: &C]) -> bool` into the plugin's entry points:
/// `true` keeps the record unchanged, `false` drops it. See the [crate docs](crate).
pub use floe_sdk_macros::filter;
/// Turns `fn(record: &Record [, config: &C]) -> Vec<Emit>` into the plugin's entry
/// points: each record is replaced by the outputs. See the [crate docs](crate).
pub use floe_sdk_macros::flat_map;
/// Turns `fn(record: &Record [, config: &C]) -> Answer` (or a [`Patch`], an [`Emit`],
/// an `Option` of those, or a `Result`) into the plugin's entry points. See the
/// [crate docs](crate).
pub use floe_sdk_macros::map;

mod answer;
mod error;
mod record;

pub mod hash;
pub mod json;
pub mod log;
pub mod path;
pub mod testing;
pub mod wire;

#[doc(hidden)]
pub mod __export;

pub use answer::{Answer, Emit, IntoAnswer, IntoEmits, IntoKeep, Patch};
pub use error::Error;
pub use record::{Metadata, Record};

/// The version of the plugin contract (`wit/transform.wit`) this SDK builds.
pub const CONTRACT_VERSION: &str = "0.2.2";

/// A transform plugin. The [`filter`], [`map`] and [`flat_map`] attributes implement
/// it for you; implement it yourself for anything else, and [`export!`] it:
///
/// ```
/// use floe_sdk::{Answer, Error, Record, Transform};
///
/// /// Drops every record after the first `limit` of each batch of the plugin's life.
/// struct Sample {
///     limit: u64,
///     seen: u64,
/// }
///
/// #[derive(serde::Deserialize)]
/// struct Config {
///     limit: u64,
/// }
///
/// impl Transform for Sample {
///     type Config = Config;
///
///     fn new(config: Config) -> Result<Self, Error> {
///         Ok(Sample { limit: config.limit, seen: 0 })
///     }
///
///     fn process(&mut self, _record: &Record<'_>) -> Result<Answer, Error> {
///         self.seen += 1;
///         Ok(if self.seen <= self.limit { Answer::UNCHANGED } else { Answer::Dropped })
///     }
/// }
///
/// floe_sdk::export!(Sample);
/// ```
pub trait Transform: Sized + 'static {
    /// The plugin's `with` table from the pipeline config, deserialized with serde.
    /// [`NoConfig`] takes none.
    type Config: serde::de::DeserializeOwned;

    /// Builds the plugin from its config; an error stops the pipeline at startup.
    fn new(config: Self::Config) -> Result<Self, Error>;

    /// Answers for one record. `Err` sends that record alone to the pipeline's
    /// `on_error` policy (dead letter by default).
    fn process(&mut self, record: &Record<'_>) -> Result<Answer, Error>;
}

/// The config of a plugin that takes none: an empty `with` table (any key is an
/// error).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

/// Builds a plugin from its config in JSON text (what the agent passes to `init`).
/// An empty text or `null` is an empty table.
pub fn init_from_json<T: Transform>(config: &str) -> Result<T, Error> {
    let value: Value = if config.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(config)
            .map_err(|e| Error::msg(format!("plugin config is not JSON: {e}")))?
    };
    let value = if value.is_null() {
        Value::Object(Map::new())
    } else {
        value
    };
    let config = T::Config::deserialize(value)
        .map_err(|e| Error::msg(format!("invalid plugin config: {e}")))?;
    T::new(config)
}

use serde::Deserialize as _;

/// Exports a [`Transform`] as the plugin's entry points. Use once per plugin crate
/// (the [`filter`], [`map`] and [`flat_map`] attributes do it for you).
///
/// On `wasm32` this generates the component exports; natively it expands to nothing,
/// so the same crate builds and tests with plain `cargo test`.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::__export::bindings::exports::floe_plugin::transform::plugin::Guest;

            ::std::thread_local! {
                static INSTANCE: ::std::cell::RefCell<::std::option::Option<$plugin>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }

            struct FloeGuest;

            impl Guest for FloeGuest {
                fn init(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::__export::install_panic_hook();
                    let plugin = $crate::init_from_json::<$plugin>(&config).map_err(|e| e.to_string())?;
                    INSTANCE.with(|i| *i.borrow_mut() = ::std::option::Option::Some(plugin));
                    ::std::result::Result::Ok(())
                }

                fn process(batch: ::std::vec::Vec<u8>) -> ::std::vec::Vec<u8> {
                    INSTANCE.with(|i| {
                        let mut guard = i.borrow_mut();
                        match guard.as_mut() {
                            ::std::option::Option::Some(plugin) => $crate::__export::process_batch(plugin, &batch),
                            ::std::option::Option::None => $crate::__export::before_init(&batch),
                        }
                    })
                }
            }

            $crate::__export::bindings::__export_floe_guest!(FloeGuest with_types_in $crate::__export::bindings);
        };
    };
}

/// What plugin code usually needs: `use floe_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::json::{FieldRef, Json, Kind, ObjectWriter};
    pub use crate::path::FieldPath;
    pub use crate::{
        Answer, Emit, Error, NoConfig, Patch, Record, Transform, error, filter, flat_map, map,
    };
}
