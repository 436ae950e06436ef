//! Decode stage: message bytes -> a parsed JSON object, or a reason to reject it.
//!
//! JSON values are parsed once into [`crate::record::json`] (text plus token tape).
//! Avro values (Confluent wire format with a schema registry, or plain Avro with a
//! schema file) are decoded with their writer schema straight into the same
//! representation (the JSON mapping documented in `docs/types.md`); the writer schema's
//! columns travel with the record so the table gets the exact Iceberg types the Avro
//! schema declares (`avro::types`). The original bytes always stay with the message
//! for the dead-letter path.

pub mod avro;
pub mod registry;

use std::path::PathBuf;
use std::sync::Arc;

use iceberg::spec::StructType;
use serde::Deserialize;
use serde_json::Value;

use crate::record::json::{JsonError, JsonObject, Tape};

use self::avro::{WriterSchema, split_confluent};
use self::registry::{RegistryClient, RegistryConfig};

/// Value (and key) format of a pipeline's messages (`[pipelines.decode]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    /// `json` (default) or `avro`.
    #[serde(default)]
    pub format: Format,
    /// Schema registry for the Confluent wire format (magic byte 0, 4-byte schema id).
    #[serde(default)]
    pub registry: Option<RegistryConfig>,
    /// Plain Avro (no header) written with this schema (`.avsc` file), instead of a registry.
    #[serde(default)]
    pub schema_file: Option<PathBuf>,
    /// How keys are decoded into `_kafka_key`: `string` (default, UTF-8 as is),
    /// `json` or `avro` (decoded like values, stored as JSON text).
    #[serde(default)]
    pub key_format: KeyFormat,
}

/// Supported value formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One JSON object per message.
    #[default]
    Json,
    /// One Avro record per message (with `registry` or `schema_file`).
    Avro,
}

/// Supported key formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// UTF-8 text, stored as is.
    #[default]
    String,
    /// A JSON value, stored as its compact JSON text.
    Json,
    /// An Avro value decoded like the values (same registry or schema file), stored as JSON text.
    Avro,
}

impl DecodeConfig {
    /// Problems a valid TOML section can still have, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let avro = self.format == Format::Avro || self.key_format == KeyFormat::Avro;
        match (avro, &self.registry, &self.schema_file) {
            (true, None, None) => out.push((
                "format",
                "Avro needs `registry` (Confluent wire format) or `schema_file` (plain Avro)"
                    .into(),
            )),
            (_, Some(_), Some(_)) => out.push((
                "schema_file",
                "set either `registry` or `schema_file`, not both".into(),
            )),
            (_, None, Some(_)) if self.key_format == KeyFormat::Avro => out.push((
                "key_format",
                "Avro keys need a `registry` (a schema file describes the values)".into(),
            )),
            (false, Some(_), _) | (false, _, Some(_)) => out.push((
                "format",
                "`registry` and `schema_file` are for format = \"avro\"".into(),
            )),
            _ => {}
        }
        out
    }
}

/// Why a message could not be decoded. Such a message goes to the dead-letter path,
/// except [`DecodeError::RegistryUnreachable`], a transient failure of the pipeline.
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
    /// The registry answered 404 for this id.
    #[error("schema id {id} is unknown to the schema registry at {url}")]
    UnknownSchemaId {
        /// The id in the message header.
        id: u32,
        /// The registry asked.
        url: String,
    },
    /// The schema is not usable (not Avro, does not parse, not a record, recursive).
    #[error("writer schema {}: {reason}", id.map_or("from schema_file".to_string(), |i| format!("id {i}")))]
    BadSchema {
        /// Registry id, `None` for a schema file.
        id: Option<u32>,
        /// What is wrong.
        reason: String,
    },
    /// The registry could not be asked (connection, timeout, 5xx, auth).
    #[error("schema registry at {url} is unreachable: {reason}")]
    RegistryUnreachable {
        /// The registry URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The key could not be decoded.
    #[error("key: {0}")]
    Key(Box<DecodeError>),
    /// The schema file could not be read.
    #[error("cannot read schema_file {path}: {reason}")]
    SchemaFile {
        /// The configured path.
        path: String,
        /// Why.
        reason: String,
    },
}

impl crate::error::Classify for DecodeError {
    fn class(&self) -> crate::error::ErrorClass {
        match self {
            DecodeError::RegistryUnreachable { .. } => crate::error::ErrorClass::Transient,
            DecodeError::Key(inner) => inner.class(),
            DecodeError::SchemaFile { .. } => crate::error::ErrorClass::Fatal,
            _ => crate::error::ErrorClass::BadRecord,
        }
    }
}

/// A decoded message value.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The record as a parsed JSON object.
    pub value: JsonObject,
    /// For Avro: the columns of the writer schema, with their exact Iceberg types.
    pub declared: Option<Arc<StructType>>,
}

/// Largest allocation the Avro decoder may make for one array, map, string or bytes.
pub const MAX_AVRO_ALLOCATION: usize = 64 << 20;

/// Decodes message values and keys according to a pipeline's [`DecodeConfig`].
#[derive(Debug)]
pub struct Decoder {
    format: Format,
    key_format: KeyFormat,
    registry: Option<RegistryClient>,
    plain: Option<Arc<WriterSchema>>,
}

impl Decoder {
    /// Builds the decoder; reads and checks `schema_file` if one is configured.
    pub fn new(config: &DecodeConfig) -> Result<Decoder, DecodeError> {
        // apache-avro reserves memory from counts in the data: a 10-byte message
        // claiming a billion items must fail, not abort the process.
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        let registry = config
            .registry
            .clone()
            .map(RegistryClient::new)
            .transpose()?;
        let plain = match &config.schema_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| DecodeError::SchemaFile {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                Some(Arc::new(WriterSchema::parse(None, &text)?))
            }
            None => None,
        };
        Ok(Decoder {
            format: config.format,
            key_format: config.key_format,
            registry,
            plain,
        })
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
        self.key_format == KeyFormat::Avro && self.registry.is_some()
    }

    /// Whether `prepare` should look at values.
    pub fn values_use_registry(&self) -> bool {
        self.format == Format::Avro && self.registry.is_some()
    }

    /// Decodes one value. For Avro with a registry the schema must have been fetched by
    /// [`Decoder::prepare`] (an id that is still unknown is reported as such).
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
        }
    }

    /// The text stored in `_kafka_key`, or why the key cannot be decoded.
    pub fn decode_key(&self, bytes: &[u8]) -> Result<String, DecodeError> {
        let key_err = |e: DecodeError| DecodeError::Key(Box::new(e));
        match self.key_format {
            KeyFormat::String => std::str::from_utf8(bytes)
                .map(str::to_string)
                .map_err(|_| key_err(DecodeError::NotJson("not UTF-8".into()))),
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
        }
    }

    fn avro_schema<'b>(
        &self,
        bytes: &'b [u8],
    ) -> Result<(Arc<WriterSchema>, &'b [u8]), DecodeError> {
        if let Some(schema) = &self.plain
            && self.registry.is_none()
        {
            return Ok((schema.clone(), bytes));
        }
        let registry = self
            .registry
            .as_ref()
            .expect("config check: avro has a registry or a schema file");
        let (id, body) = split_confluent(bytes)?;
        match registry.cached(id) {
            Some(result) => Ok((result?, body)),
            None => Err(DecodeError::RegistryUnreachable {
                url: "(schema not fetched)".into(),
                reason: format!("schema id {id} was not fetched before decoding"),
            }),
        }
    }
}

/// Checks that bytes are one JSON object (parsing into a reusable tape).
pub fn validate_object(bytes: &[u8], tape: &mut Tape) -> Result<(), DecodeError> {
    tape.parse(bytes).map(|_| ()).map_err(DecodeError::from)
}

pub use crate::record::json_kind;

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
                .contains("cannot read schema_file")
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
