//! Decode stage: message value bytes -> a JSON object.
//!
//! The decoded object drives schema inference; the original bytes are kept for the
//! Arrow encoder and for the dead-letter path, so nothing is re-serialized.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Value format of a pipeline's messages (`[pipelines.decode]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    /// Only `json` today.
    #[serde(default)]
    pub format: Format,
}

/// Supported value formats.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One JSON object per message.
    #[default]
    Json,
}

/// Why a message could not be decoded. Such a message goes to the dead-letter path.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes are not valid JSON.
    #[error("value is not valid JSON: {0}")]
    NotJson(String),
    /// Valid JSON, but not an object, so it cannot be a row.
    #[error("value is a JSON {0}, expected an object")]
    NotAnObject(&'static str),
}

/// Decodes one message value into a JSON object.
pub fn decode_json(bytes: &[u8]) -> Result<Map<String, Value>, DecodeError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(DecodeError::NotAnObject(json_kind(&other))),
        Err(e) => Err(DecodeError::NotJson(e.to_string())),
    }
}

/// Checks that bytes are one JSON object, without building it (cheaper than [`decode_json`]).
pub fn validate_object(bytes: &[u8]) -> Result<(), DecodeError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map(|_| ())
            .map_err(|e| DecodeError::NotJson(e.to_string())),
        // Not an object: decode it to say what it is instead.
        _ => decode_json(bytes).map(|_| ()),
    }
}

/// A short name of a JSON value's kind, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number with fraction",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_decode() {
        let m = decode_json(br#"{"a": 1, "b": [true]}"#).unwrap();
        assert_eq!(m["a"], 1);
    }

    #[test]
    fn validation_agrees_with_decoding() {
        for input in [
            &br#"{"a": [1, {"b": null}]}"#[..],
            b"  {}",
            b"[1]",
            b"42",
            b"{bad",
            b"{} trailing",
            b"",
            b"\xff",
        ] {
            assert_eq!(
                validate_object(input),
                decode_json(input).map(|_| ()),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn other_values_are_rejected_with_reason() {
        assert_eq!(
            decode_json(b"[1,2]"),
            Err(DecodeError::NotAnObject("array"))
        );
        assert_eq!(decode_json(b"42"), Err(DecodeError::NotAnObject("integer")));
        let e = decode_json(b"{not json").unwrap_err();
        assert!(matches!(e, DecodeError::NotJson(_)));
        assert!(e.to_string().contains("not valid JSON"));
        assert!(matches!(
            decode_json(&[0xff, 0xfe]),
            Err(DecodeError::NotJson(_))
        ));
    }
}
