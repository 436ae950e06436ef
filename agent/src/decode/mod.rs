//! Decode stage: message bytes -> a parsed JSON object, or a reason to reject it.
//!
//! JSON values are parsed once into [`crate::record::json`] (text plus token tape).
//! Avro, Protobuf and JSON Schema values (Confluent wire format with a schema registry,
//! or plain with a schema from config) are decoded with their schema into the same
//! representation (the JSON mapping documented in `docs/types.md`); the schema's
//! columns travel with the record so the table gets the exact Iceberg types the schema
//! declares (`avro::types`, `protobuf::types`, `json_schema::types`). Avro is written
//! straight into the parsed representation; Protobuf and JSON Schema write JSON text
//! ([`Decoder::decode_value_text`]) that is parsed once. The original bytes always stay
//! with the message for the dead-letter path.

pub mod avro;
pub mod json_schema;
pub mod protobuf;
pub mod registry;
mod text;

use std::path::PathBuf;
use std::sync::Arc;

use iceberg::spec::StructType;
use serde::Deserialize;
use serde_json::Value;

use crate::record::json::{JsonError, JsonObject, Tape};

use self::avro::{WriterSchema, split_confluent};
use self::json_schema::JsonSchemaDoc;
use self::protobuf::{ProtoMessage, ProtoSource, split_message_indexes};
use self::registry::{RegistryClient, RegistryConfig, RegistrySchema};

/// Value (and key) format of a pipeline's messages (`[pipelines.decode]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    /// `json` (default), `avro`, `protobuf` or `json_schema`.
    #[serde(default)]
    pub format: Format,
    /// Schema registry for the Confluent wire format (magic byte 0, 4-byte schema id).
    #[serde(default)]
    pub registry: Option<RegistryConfig>,
    /// Plain messages (no header) written with this schema, instead of a registry: an
    /// `.avsc` file (Avro), a JSON schema (`json_schema`) or a `.proto` file (Protobuf,
    /// with `message`).
    #[serde(default)]
    pub schema_file: Option<PathBuf>,
    /// Plain Protobuf: a binary `FileDescriptorSet` (`protoc --include_imports
    /// --descriptor_set_out=FILE`), instead of `schema_file`.
    #[serde(default)]
    pub descriptor_set: Option<PathBuf>,
    /// Plain Protobuf with a `.proto` `schema_file`: directories its imports are looked up
    /// in (default: the file's directory); `google/protobuf/*.proto` are built in.
    #[serde(default)]
    pub import_paths: Vec<PathBuf>,
    /// Plain Protobuf: the fully qualified message type of the values, e.g. `shop.Order`.
    #[serde(default)]
    pub message: Option<String>,
    /// Plain Protobuf keys (`key_format = "protobuf"`): the key's message type.
    #[serde(default)]
    pub key_message: Option<String>,
    /// How keys are decoded into `_kafka_key`: `string` (default, UTF-8 as is; other
    /// bytes are dead-lettered), `base64` (any bytes, stored as standard base64 text),
    /// `json`, or `avro` / `protobuf` / `json_schema` (decoded like values, stored as
    /// JSON text).
    #[serde(default)]
    pub key_format: KeyFormat,
}

/// Supported value formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// One JSON object per message.
    #[default]
    Json,
    /// One Avro record per message (with `registry` or `schema_file`).
    Avro,
    /// One Protobuf message per message (with `registry`, or `schema_file` /
    /// `descriptor_set` and `message`).
    Protobuf,
    /// One JSON object per message, validated and typed by a JSON schema (with `registry`
    /// or `schema_file`).
    JsonSchema,
}

/// Supported key formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// UTF-8 text, stored as is.
    #[default]
    String,
    /// Any bytes (binary ids, hashes), stored as their standard base64 text. Every key
    /// is encoded, so one key always maps to one text.
    Base64,
    /// A JSON value, stored as its compact JSON text.
    Json,
    /// An Avro value decoded with the registry, stored as JSON text.
    Avro,
    /// A Protobuf message decoded with the registry (or `key_message`), stored as JSON text.
    Protobuf,
    /// A JSON value validated with its registry schema, stored as JSON text.
    JsonSchema,
}

impl KeyFormat {
    fn schema_format(self) -> Option<Format> {
        match self {
            KeyFormat::Avro => Some(Format::Avro),
            KeyFormat::Protobuf => Some(Format::Protobuf),
            KeyFormat::JsonSchema => Some(Format::JsonSchema),
            KeyFormat::String | KeyFormat::Base64 | KeyFormat::Json => None,
        }
    }
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Json => "json",
        Format::Avro => "avro",
        Format::Protobuf => "protobuf",
        Format::JsonSchema => "json_schema",
    }
}

/// What a registry schema id must be for a format.
fn registry_type(f: Format) -> &'static str {
    match f {
        Format::Avro => "AVRO",
        Format::Protobuf => "PROTOBUF",
        Format::JsonSchema => "JSON",
        Format::Json => "none",
    }
}

impl DecodeConfig {
    /// Problems a valid TOML section can still have, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let value_schema = self.format != Format::Json;
        let key_schema = self.key_format.schema_format();
        let plain = self.schema_file.is_some() || self.descriptor_set.is_some();
        if let Some(r) = &self.registry {
            out.extend(r.problems());
        }
        if self.schema_file.is_some() && self.descriptor_set.is_some() {
            out.push((
                "descriptor_set",
                "set either `schema_file` or `descriptor_set`, not both".into(),
            ));
        }
        if self.descriptor_set.is_some()
            && self.format != Format::Protobuf
            && self.key_format != KeyFormat::Protobuf
        {
            out.push((
                "descriptor_set",
                "`descriptor_set` is for format = \"protobuf\"".into(),
            ));
        }
        match (value_schema || key_schema.is_some(), &self.registry, plain) {
            (true, None, false) => out.push((
                if value_schema { "format" } else { "key_format" },
                format!(
                    "format {} needs `registry` (Confluent wire format) or a schema from config ({})",
                    format_name(if value_schema { self.format } else { key_schema.expect("a key schema") }),
                    if self.format == Format::Protobuf || self.key_format == KeyFormat::Protobuf {
                        "`schema_file` = a .proto file or `descriptor_set`, with `message`"
                    } else {
                        "`schema_file`, plain Avro / JSON without the header"
                    }
                ),
            )),
            (_, Some(_), true) => out.push((
                if self.descriptor_set.is_some() { "descriptor_set" } else { "schema_file" },
                "set either `registry` or a schema from config, not both".into(),
            )),
            (false, Some(_), _) | (false, _, true) => out.push((
                "format",
                "`registry` and `schema_file` are for format = \"avro\", \"protobuf\" or \"json_schema\""
                    .into(),
            )),
            _ => {}
        }
        if plain && self.registry.is_none() {
            // A schema from config describes the values (and, for Protobuf, named keys).
            match self.key_format {
                KeyFormat::Avro | KeyFormat::JsonSchema => out.push((
                    "key_format",
                    "Avro and JSON Schema keys need a `registry` (a schema file describes the values)"
                        .into(),
                )),
                KeyFormat::Protobuf if self.key_message.is_none() => out.push((
                    "key_message",
                    "plain Protobuf keys need `key_message`, the key's message type".into(),
                )),
                _ => {}
            }
            if self.format == Format::Protobuf && self.message.is_none() {
                out.push((
                    "message",
                    "plain Protobuf needs `message`, the fully qualified message type (e.g. \"shop.Order\")"
                        .into(),
                ));
            }
        }
        let plain_proto = plain && self.registry.is_none();
        if self.message.is_some() && !(plain_proto && self.format == Format::Protobuf) {
            out.push((
                "message",
                "`message` is for plain Protobuf values (format = \"protobuf\" with `schema_file` or `descriptor_set`); with a registry the message comes from the header"
                    .into(),
            ));
        }
        if self.key_message.is_some() && !(plain_proto && self.key_format == KeyFormat::Protobuf) {
            out.push((
                "key_message",
                "`key_message` is for plain Protobuf keys (key_format = \"protobuf\" with `schema_file` or `descriptor_set`)"
                    .into(),
            ));
        }
        if !self.import_paths.is_empty()
            && !(self.schema_file.is_some()
                && (self.format == Format::Protobuf || self.key_format == KeyFormat::Protobuf))
        {
            out.push((
                "import_paths",
                "`import_paths` is for a .proto `schema_file`".into(),
            ));
        }
        out
    }
}

/// What the decoder does with a message its JSON schema rejects (the pipeline's
/// `on_incompatible`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InvalidPolicy {
    /// Report [`DecodeError::Invalid`]; the record is dead-lettered.
    #[default]
    DeadLetter,
    /// Report [`DecodeError::Invalid`] that stops the pipeline.
    Fail,
    /// Write the record anyway; the schema stage checks its values against the columns.
    Coerce,
}

/// Why a message could not be decoded. Such a message goes to the dead-letter path,
/// except errors that [`stop the pipeline`](DecodeError::stops_pipeline).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes are not one acceptable JSON object.
    #[error(transparent)]
    Json(#[from] JsonError),
    /// The bytes are not valid JSON (keys).
    #[error("value is not valid JSON: {0}")]
    NotJson(String),
    /// Valid JSON, but not an object, so it cannot be a row.
    #[error("value is a JSON {0}, expected an object")]
    NotAnObject(&'static str),
    /// The bytes are not an Avro record of the writer schema.
    #[error("value is not valid Avro: {0}")]
    NotAvro(String),
    /// The bytes are not a Protobuf message of the schema (or its message indexes are wrong).
    #[error("value is not valid Protobuf: {0}")]
    NotProtobuf(String),
    /// The bytes do not start with the Confluent header.
    #[error("value is not in the Confluent wire format: {0}")]
    NotFramed(String),
    /// A JSON value that does not match its JSON schema.
    #[error(
        "value does not match its JSON schema{}: {reason}{}",
        id.map_or_else(String::new, |i| format!(" (id {i})")),
        if *stop { " (on_incompatible = \"fail\")" } else { "" }
    )]
    Invalid {
        /// Registry id, `None` for a schema file.
        id: Option<u32>,
        /// The first violation, with its place in the value.
        reason: String,
        /// The policy is `fail`: the pipeline stops.
        stop: bool,
    },
    /// The registry answered 404 for this id.
    #[error("schema id {id} is unknown to the schema registry at {url}")]
    UnknownSchemaId {
        /// The id in the message header.
        id: u32,
        /// The registry asked (without credentials).
        url: String,
    },
    /// The schema is not usable (wrong type, does not parse, recursive, missing reference).
    #[error("writer schema {}: {reason}", id.map_or("from config".to_string(), |i| format!("id {i}")))]
    BadSchema {
        /// Registry id, `None` for a schema from config.
        id: Option<u32>,
        /// What is wrong.
        reason: String,
    },
    /// The registry could not be asked (connection, timeout, 5xx, auth).
    #[error("schema registry at {url} is unreachable: {reason}")]
    RegistryUnreachable {
        /// The registry URL (without credentials).
        url: String,
        /// What failed.
        reason: String,
    },
    /// The key could not be decoded.
    #[error("key: {0}")]
    Key(Box<DecodeError>),
    /// A schema file could not be read.
    #[error("cannot read schema file {path}: {reason}")]
    SchemaFile {
        /// The configured path.
        path: String,
        /// Why.
        reason: String,
    },
}

impl DecodeError {
    /// Whether the pipeline must stop (and re-read the record later) instead of
    /// dead-lettering it: the registry is unreachable (a transient error of the
    /// pipeline, not of the record), or a JSON-schema violation under `on_incompatible = "fail"`.
    pub fn stops_pipeline(&self) -> bool {
        match self {
            DecodeError::RegistryUnreachable { .. } | DecodeError::SchemaFile { .. } => true,
            DecodeError::Invalid { stop, .. } => *stop,
            DecodeError::Key(inner) => inner.stops_pipeline(),
            _ => false,
        }
    }

    /// Whether asking again later can help (the registry was unreachable).
    pub fn is_transient(&self) -> bool {
        match self {
            DecodeError::RegistryUnreachable { .. } => true,
            DecodeError::Key(inner) => inner.is_transient(),
            _ => false,
        }
    }
}

impl crate::error::Classify for DecodeError {
    fn class(&self) -> crate::error::ErrorClass {
        use crate::error::ErrorClass;
        if self.is_transient() {
            ErrorClass::Transient
        } else if self.stops_pipeline() {
            ErrorClass::Fatal
        } else {
            ErrorClass::BadRecord
        }
    }
}

/// A decoded message value.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The record as a parsed JSON object.
    pub value: JsonObject,
    /// For schema formats: the columns the schema declares, with their exact Iceberg types.
    pub declared: Option<Arc<StructType>>,
}

/// Largest allocation the Avro decoder may make for one array, map, string or bytes.
pub const MAX_AVRO_ALLOCATION: usize = 64 << 20;

/// A plain (header-less) schema from config.
#[derive(Debug)]
enum Plain {
    Avro(Arc<WriterSchema>),
    Json(Arc<JsonSchemaDoc>),
    Protobuf {
        value: Option<Arc<ProtoMessage>>,
        key: Option<Arc<ProtoMessage>>,
    },
}

/// Decodes message values and keys according to a pipeline's [`DecodeConfig`].
#[derive(Debug)]
pub struct Decoder {
    format: Format,
    key_format: KeyFormat,
    registry: Option<RegistryClient>,
    plain: Option<Plain>,
    invalid: InvalidPolicy,
}

fn read_file(path: &std::path::Path) -> Result<String, DecodeError> {
    std::fs::read_to_string(path).map_err(|e| DecodeError::SchemaFile {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

impl Decoder {
    /// Builds the decoder; reads and checks the schema from config if there is one.
    pub fn new(config: &DecodeConfig) -> Result<Decoder, DecodeError> {
        // apache-avro reserves memory from counts in the data: a 10-byte message
        // claiming a billion items must fail, not abort the process.
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        let registry = config
            .registry
            .clone()
            .map(RegistryClient::new)
            .transpose()?;
        let proto_source = match (&config.schema_file, &config.descriptor_set) {
            (_, Some(set)) => Some(ProtoSource::DescriptorSet(set.clone())),
            (Some(path), None) => Some(ProtoSource::ProtoFile {
                path: path.clone(),
                import_paths: config.import_paths.clone(),
            }),
            (None, None) => None,
        };
        let uses_proto =
            config.format == Format::Protobuf || config.key_format == KeyFormat::Protobuf;
        let plain = match (&config.schema_file, &proto_source) {
            _ if registry.is_some() => None,
            (_, Some(source)) if uses_proto => {
                let pool = protobuf::load_pool(source)?;
                let value = match (&config.message, config.format) {
                    (Some(name), Format::Protobuf) => Some(protobuf::plain_message(&pool, name)?),
                    _ => None,
                };
                let key = match (&config.key_message, config.key_format) {
                    (Some(name), KeyFormat::Protobuf) => {
                        Some(protobuf::plain_message(&pool, name)?)
                    }
                    _ => None,
                };
                Some(Plain::Protobuf { value, key })
            }
            (Some(path), _) if config.format == Format::JsonSchema => Some(Plain::Json(Arc::new(
                JsonSchemaDoc::parse(None, &read_file(path)?, &[])?,
            ))),
            (Some(path), _) => Some(Plain::Avro(Arc::new(WriterSchema::parse(
                None,
                &read_file(path)?,
            )?))),
            _ => None,
        };
        Ok(Decoder {
            format: config.format,
            key_format: config.key_format,
            registry,
            plain,
            invalid: InvalidPolicy::default(),
        })
    }

    /// The same decoder with a policy for JSON-schema violations (`on_incompatible`).
    pub fn on_invalid(mut self, policy: InvalidPolicy) -> Decoder {
        self.invalid = policy;
        self
    }

    /// Whether values are JSON (so the original bytes can go to the Arrow encoder as they are).
    pub fn is_json(&self) -> bool {
        self.format == Format::Json
    }

    /// The registry schema ids `messages` (values or keys) refer to that are not cached yet.
    pub fn missing_ids<'a>(&self, messages: impl Iterator<Item = &'a [u8]>) -> Vec<u32> {
        let Some(registry) = &self.registry else {
            return Vec::new();
        };
        let mut ids: Vec<u32> = messages
            .filter_map(|bytes| split_confluent(bytes).ok().map(|(id, _)| id))
            .filter(|id| registry.cached(*id).is_none())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Fetches schemas by id (see [`Decoder::missing_ids`]). Errors only when the
    /// registry cannot be asked.
    pub async fn fetch(&self, ids: Vec<u32>) -> Result<(), DecodeError> {
        if let Some(registry) = &self.registry {
            for id in ids {
                registry.fetch(id).await?;
            }
        }
        Ok(())
    }

    /// Whether keys are stored as they are (UTF-8 text).
    pub fn key_is_string(&self) -> bool {
        self.key_format == KeyFormat::String
    }

    /// Whether `prepare` should look at keys too.
    pub fn keys_use_registry(&self) -> bool {
        self.key_format.schema_format().is_some() && self.registry.is_some()
    }

    /// Whether `prepare` should look at values.
    pub fn values_use_registry(&self) -> bool {
        self.format != Format::Json && self.registry.is_some()
    }

    /// Decodes one value into a parsed JSON object. For a registry the schema must have
    /// been fetched by [`Decoder::fetch`] (an id that is still unknown is reported as such).
    pub fn decode_value(&self, bytes: &[u8]) -> Result<Decoded, DecodeError> {
        match self.format {
            Format::Json => Ok(Decoded {
                value: JsonObject::parse(bytes.to_vec())?,
                declared: None,
            }),
            Format::Avro => {
                let (schema, body) = self.avro_schema(bytes)?;
                Ok(Decoded {
                    value: schema.decode(body)?,
                    declared: Some(schema.columns.clone()),
                })
            }
            Format::Protobuf | Format::JsonSchema => {
                let mut out = Vec::with_capacity(bytes.len() * 2);
                let declared = self.decode_value_text(bytes, &mut out)?;
                Ok(Decoded {
                    value: JsonObject::parse(out)?,
                    declared,
                })
            }
        }
    }

    /// Decodes one value into the JSON text of the record (a JSON object, appended to
    /// `out`) and returns the columns its schema declares (placeholder field ids 0;
    /// `None` for plain JSON). The value conventions are those of `docs/types.md`.
    pub fn decode_value_text(
        &self,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<Arc<StructType>>, DecodeError> {
        match self.format {
            Format::Json => {
                validate_object(bytes, &mut Tape::new())?;
                out.extend_from_slice(bytes);
                Ok(None)
            }
            Format::Avro => {
                let (schema, body) = self.avro_schema(bytes)?;
                out.extend_from_slice(schema.decode(body)?.as_bytes());
                Ok(Some(schema.columns.clone()))
            }
            Format::Protobuf => {
                let message = self.proto_message(bytes, false)?;
                message.0.decode(message.1, out)?;
                Ok(Some(message.0.columns.clone()))
            }
            Format::JsonSchema => {
                let (schema, body) = self.json_schema(bytes)?;
                if !schema.is_object() {
                    return Err(DecodeError::BadSchema {
                        id: schema.id,
                        reason: "the JSON schema of a value must describe an object (one row)"
                            .into(),
                    });
                }
                schema
                    .decode(body, self.invalid != InvalidPolicy::Coerce, out)
                    .map_err(|e| self.with_policy(e))?;
                Ok(Some(schema.columns.clone()))
            }
        }
    }

    /// The text stored in `_kafka_key`, or why the key cannot be decoded.
    pub fn decode_key(&self, bytes: &[u8]) -> Result<String, DecodeError> {
        let key_err = |e: DecodeError| DecodeError::Key(Box::new(e));
        match self.key_format {
            KeyFormat::String => std::str::from_utf8(bytes)
                .map(str::to_string)
                .map_err(|_| key_err(DecodeError::NotJson("not UTF-8".into()))),
            KeyFormat::Base64 => {
                use base64::Engine as _;
                Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            KeyFormat::Json => serde_json::from_slice::<Value>(bytes)
                .map(|v| v.to_string())
                .map_err(|e| key_err(DecodeError::NotJson(e.to_string()))),
            KeyFormat::Avro => {
                let (schema, body) = self.avro_schema(bytes).map_err(key_err)?;
                // Keys are often primitives: a string key is stored as is.
                Ok(match schema.decode_any(body).map_err(key_err)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
            }
            KeyFormat::Protobuf => {
                let (message, body) = self.proto_message(bytes, true).map_err(key_err)?;
                let mut out = Vec::new();
                message.decode(body, &mut out).map_err(key_err)?;
                Ok(String::from_utf8(out).expect("the writer writes UTF-8"))
            }
            KeyFormat::JsonSchema => {
                let (schema, body) = self.json_schema(bytes).map_err(key_err)?;
                schema
                    .decode_key(body, self.invalid != InvalidPolicy::Coerce)
                    .map_err(|e| key_err(self.with_policy(e)))
            }
        }
    }

    fn with_policy(&self, e: DecodeError) -> DecodeError {
        match e {
            DecodeError::Invalid { id, reason, .. } => DecodeError::Invalid {
                id,
                reason,
                stop: self.invalid == InvalidPolicy::Fail,
            },
            other => other,
        }
    }

    /// The registry schema a framed message names, and the rest of the message.
    fn registry_schema<'b>(
        &self,
        bytes: &'b [u8],
        format: Format,
    ) -> Result<(RegistrySchema, &'b [u8]), DecodeError> {
        let registry = self
            .registry
            .as_ref()
            .expect("config check: a schema format has a registry or a schema from config");
        let (id, body) = split_confluent(bytes).map_err(|e| match (format, e) {
            (Format::Avro, e) => e,
            (_, DecodeError::NotAvro(reason)) => DecodeError::NotFramed(reason),
            (_, e) => e,
        })?;
        let schema = match registry.cached(id) {
            Some(result) => result?,
            None => {
                return Err(DecodeError::RegistryUnreachable {
                    url: registry.url().to_string(),
                    reason: format!("schema id {id} was not fetched before decoding"),
                });
            }
        };
        if schema.type_name() != registry_type(format) {
            return Err(DecodeError::BadSchema {
                id: Some(id),
                reason: format!(
                    "schema type {} is not {} (format {})",
                    schema.type_name(),
                    registry_type(format),
                    format_name(format)
                ),
            });
        }
        Ok((schema, body))
    }

    fn avro_schema<'b>(
        &self,
        bytes: &'b [u8],
    ) -> Result<(Arc<WriterSchema>, &'b [u8]), DecodeError> {
        if let Some(Plain::Avro(schema)) = &self.plain {
            return Ok((schema.clone(), bytes));
        }
        match self.registry_schema(bytes, Format::Avro)? {
            (RegistrySchema::Avro(s), body) => Ok((s, body)),
            _ => unreachable!("registry_schema checks the type"),
        }
    }

    fn json_schema<'b>(
        &self,
        bytes: &'b [u8],
    ) -> Result<(Arc<JsonSchemaDoc>, &'b [u8]), DecodeError> {
        if let Some(Plain::Json(schema)) = &self.plain {
            return Ok((schema.clone(), bytes));
        }
        match self.registry_schema(bytes, Format::JsonSchema)? {
            (RegistrySchema::Json(s), body) => Ok((s, body)),
            _ => unreachable!("registry_schema checks the type"),
        }
    }

    fn proto_message<'b>(
        &self,
        bytes: &'b [u8],
        key: bool,
    ) -> Result<(Arc<ProtoMessage>, &'b [u8]), DecodeError> {
        if let Some(Plain::Protobuf { value, key: k }) = &self.plain {
            let message = if key { k } else { value };
            return message
                .clone()
                .map(|m| (m, bytes))
                .ok_or_else(|| DecodeError::BadSchema {
                    id: None,
                    reason: "no message type configured".into(),
                });
        }
        let (schema, body) = match self.registry_schema(bytes, Format::Protobuf)? {
            (RegistrySchema::Protobuf(s), body) => (s, body),
            _ => unreachable!("registry_schema checks the type"),
        };
        let (indexes, body) = split_message_indexes(body)?;
        Ok((schema.message(indexes.as_slice())?, body))
    }
}

/// Checks that bytes are one JSON object (parsing into a reusable tape).
pub fn validate_object(bytes: &[u8], tape: &mut Tape) -> Result<(), DecodeError> {
    tape.parse(bytes).map(|_| ()).map_err(DecodeError::from)
}

pub use crate::record::json_kind;

/// Asserts that `columns` are the named columns of the given type names, in order
/// (`note` says which fields have none).
#[cfg(test)]
pub(crate) fn assert_columns(columns: &StructType, expect: &[(&str, &str)], note: &str) {
    let got: Vec<(String, String)> = columns
        .fields()
        .iter()
        .map(|f| (f.name.clone(), crate::schema::type_name(&f.field_type)))
        .collect();
    let expect: Vec<(String, String)> = expect
        .iter()
        .map(|(name, ty)| (name.to_string(), ty.to_string()))
        .collect();
    assert_eq!(got, expect, "{note}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> DecodeConfig {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn avro_needs_a_schema_source() {
        let problems = |t: &str| config(t).problems();
        assert!(problems(r#"format = "avro""#)[0].1.contains("registry"));
        assert!(
            problems(
                r#"format = "avro"
            schema_file = "a.avsc"
            registry = { url = "http://x" }"#
            )[0]
            .1
            .contains("not both")
        );
        assert!(problems(r#"schema_file = "a.avsc""#)[0].1.contains("avro"));
        assert!(
            problems(
                r#"format = "avro"
            key_format = "avro"
            schema_file = "a.avsc""#
            )[0]
            .0 == "key_format"
        );
        assert!(
            problems(
                r#"format = "avro"
            registry = { url = "http://x", username = "u", password = "p", timeout = "2s" }"#
            )
            .is_empty()
        );
    }

    #[test]
    fn keys_decode_by_format() {
        let json = Decoder::new(&config(r#"key_format = "json""#)).unwrap();
        assert_eq!(json.decode_key(br#"{"id": 1}"#).unwrap(), r#"{"id":1}"#);
        assert!(
            json.decode_key(b"{bad")
                .unwrap_err()
                .to_string()
                .starts_with("key: ")
        );
        let plain = Decoder::new(&DecodeConfig::default()).unwrap();
        assert_eq!(plain.decode_key(b"k1").unwrap(), "k1");
        assert!(plain.decode_key(b"\xff").is_err());
    }

    #[test]
    fn plain_avro_uses_the_schema_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.avsc");
        std::fs::write(
            &path,
            r#"{"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}"#,
        )
        .unwrap();
        let decoder = Decoder::new(&DecodeConfig {
            format: Format::Avro,
            schema_file: Some(path),
            ..DecodeConfig::default()
        })
        .unwrap();
        // zig-zag 21 = 42
        let d = decoder.decode_value(&[42]).unwrap();
        assert_eq!(d.value.to_serde()["n"], 21);
        assert!(d.declared.is_some());
        let missing = Decoder::new(&DecodeConfig {
            format: Format::Avro,
            schema_file: Some("/nonexistent/x.avsc".into()),
            ..DecodeConfig::default()
        });
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("cannot read schema file")
        );
    }

    #[test]
    fn schema_formats_need_a_schema_source() {
        let problems = |t: &str| config(t).problems();
        let fields = |t: &str| problems(t).into_iter().map(|p| p.0).collect::<Vec<_>>();
        assert!(
            problems(r#"format = "protobuf""#)[0]
                .1
                .contains("`message`")
        );
        assert!(
            problems(r#"format = "json_schema""#)[0]
                .1
                .contains("registry")
        );
        assert_eq!(fields(r#"key_format = "protobuf""#), ["key_format"]);
        assert!(
            problems(
                r#"format = "protobuf"
            registry = { url = "http://x" }
            key_format = "json_schema""#
            )
            .is_empty()
        );
        assert!(
            problems(
                r#"format = "protobuf"
            schema_file = "o.proto"
            message = "shop.Order""#
            )
            .is_empty()
        );
        assert_eq!(
            fields(
                r#"format = "protobuf"
            schema_file = "o.proto""#
            ),
            ["message"]
        );
        assert_eq!(
            fields(
                r#"format = "protobuf"
            schema_file = "o.proto"
            descriptor_set = "o.desc"
            message = "M""#
            ),
            ["descriptor_set"]
        );
        assert_eq!(
            fields(
                r#"format = "protobuf"
            registry = { url = "http://x" }
            message = "M""#
            ),
            ["message"]
        );
        assert_eq!(
            fields(
                r#"format = "protobuf"
            descriptor_set = "o.desc"
            message = "M"
            key_format = "protobuf""#
            ),
            ["key_message"]
        );
        assert_eq!(
            fields(
                r#"format = "json_schema"
            schema_file = "o.json"
            key_format = "json_schema""#
            ),
            ["key_format"]
        );
        assert_eq!(
            fields(
                r#"format = "json_schema"
            schema_file = "o.json"
            import_paths = ["p"]"#
            ),
            ["import_paths"]
        );
        assert_eq!(
            fields(
                r#"format = "avro"
            registry = { url = "not a url" }"#
            ),
            ["registry.url"]
        );
    }

    #[test]
    fn plain_json_schema_validates_and_follows_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.json");
        std::fs::write(
            &path,
            r#"{"type": "object", "properties": {"n": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}}}"#,
        )
        .unwrap();
        let cfg = DecodeConfig {
            format: Format::JsonSchema,
            schema_file: Some(path),
            ..DecodeConfig::default()
        };
        let decoder = Decoder::new(&cfg).unwrap();
        let mut out = Vec::new();
        let declared = decoder
            .decode_value_text(br#"{"n": 1, "at": "2024-01-02T05:04:05+02:00"}"#, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(declared.fields().len(), 2);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"n":1,"at":"2024-01-02T03:04:05.000000Z"}"#
        );
        let e = decoder.decode_value(br#"{"n": "x"}"#).unwrap_err();
        assert!(!e.stops_pipeline(), "{e}");
        let failing = Decoder::new(&cfg).unwrap().on_invalid(InvalidPolicy::Fail);
        let e = failing.decode_value(br#"{"n": "x"}"#).unwrap_err();
        assert!(e.stops_pipeline());
        assert!(
            e.to_string().ends_with("(on_incompatible = \"fail\")"),
            "{e}"
        );
        let coercing = Decoder::new(&cfg)
            .unwrap()
            .on_invalid(InvalidPolicy::Coerce);
        assert_eq!(
            coercing
                .decode_value(br#"{"n": "x"}"#)
                .unwrap()
                .value
                .to_serde()["n"],
            "x"
        );
    }

    #[test]
    fn avro_references_define_named_types() {
        let address = r#"{"type": "record", "name": "Address", "namespace": "shop",
            "fields": [{"name": "street", "type": "string"}]}"#;
        let order = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "ship_to", "type": "shop.Address"},
            {"name": "bill_to", "type": ["null", "shop.Address"]}]}"#;
        assert!(WriterSchema::parse(Some(2), order).is_err());
        let schema = WriterSchema::parse_with_references(Some(2), order, &[address]).unwrap();
        assert_eq!(
            crate::schema::type_name(&iceberg::spec::Type::Struct((*schema.columns).clone())),
            "struct<ship_to: struct<street: string>, bill_to: struct<street: string>>"
        );
        // ship_to "ab", bill_to: branch 1, "c".
        let object = schema.decode(&[4, b'a', b'b', 2, 2, b'c']).unwrap();
        assert_eq!(
            object.to_serde(),
            serde_json::json!({"ship_to": {"street": "ab"}, "bill_to": {"street": "c"}})
        );
    }

    #[test]
    fn json_values_are_parsed_or_rejected_with_reason() {
        let plain = Decoder::new(&DecodeConfig::default()).unwrap();
        let d = plain.decode_value(br#"{"a": 1, "b": [true]}"#).unwrap();
        assert_eq!(d.value.to_serde()["a"], 1);
        assert!(d.declared.is_none());
        let e = plain.decode_value(b"[1,2]").unwrap_err();
        assert_eq!(e.to_string(), "value is a JSON array, expected an object");
        let e = plain.decode_value(b"{not json").unwrap_err();
        assert!(e.to_string().contains("not valid JSON"), "{e}");
        assert!(plain.decode_value(&[0xff, 0xfe]).is_err());
        let mut tape = Tape::new();
        assert!(validate_object(b"  {}", &mut tape).is_ok());
        assert!(validate_object(b"{} trailing", &mut tape).is_err());
    }
}
