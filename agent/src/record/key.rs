//! Upsert keys: which columns identify a row, and a 128-bit digest of their values.
//!
//! The same digest is computed from a JSON record (when buffering) and from Arrow columns
//! (when rebuilding the index from the table's Parquet files), so both sides encode each
//! value canonically first: integers as 8 bytes, strings as length + UTF-8 bytes.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use twox_hash::XxHash3_128;

use crate::record::json::{Obj, Value};

/// The digest that identifies a row (collision odds about n² / 2¹²⁹: 10⁻²¹ for 10⁹ keys).
pub type KeyHash = u128;

/// Name of the Kafka message key column, also the config value meaning "the message key".
pub const MESSAGE_KEY: &str = "_kafka_key";

/// Why a record has no usable upsert key (it goes to the dead letters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The table is keyed by the message key and the message has none.
    #[error("upsert by message key: the message has no key")]
    NoMessageKey,
    /// A tombstone on a table keyed by payload fields.
    #[error(
        "tombstone on a table keyed by payload fields {0:?}: a null value carries no field to find the row by (key the table by `_kafka_key` to delete with tombstones)"
    )]
    Tombstone(Vec<String>),
    /// A key field is absent or null.
    #[error("key field `{0}` is missing or null")]
    Missing(String),
    /// A key field is neither a string nor an integer.
    #[error("key field `{field}` must be a string or an integer, got {kind}")]
    NotAKey {
        /// The key field.
        field: String,
        /// The JSON kind it has.
        kind: &'static str,
    },
}

/// Which columns form the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The Kafka message key (`_kafka_key`); a tombstone deletes the row.
    MessageKey,
    /// Top-level fields of the (transformed) value.
    Fields(Vec<String>),
}

impl KeySpec {
    /// From the `key` setting: `["_kafka_key"]` or field names.
    pub fn from_config(key: &[String]) -> KeySpec {
        if key.len() == 1 && key[0] == MESSAGE_KEY {
            KeySpec::MessageKey
        } else {
            KeySpec::Fields(key.to_vec())
        }
    }

    /// The key's column names.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            KeySpec::MessageKey => vec![MESSAGE_KEY],
            KeySpec::Fields(f) => f.iter().map(String::as_str).collect(),
        }
    }

    /// The key of a record: `value` is its (final) value, `None` for a tombstone;
    /// `message_key` the message key as stored in `_kafka_key`. The error explains why
    /// the record has no usable key (it goes to the dead letters).
    pub fn of_record(
        &self,
        value: Option<Obj<'_>>,
        message_key: Option<&str>,
    ) -> Result<KeyHash, KeyError> {
        let mut buf = Vec::with_capacity(32);
        match self {
            KeySpec::MessageKey => {
                let key = message_key.ok_or(KeyError::NoMessageKey)?;
                put_str(&mut buf, key);
            }
            KeySpec::Fields(fields) => {
                let Some(map) = value else {
                    return Err(KeyError::Tombstone(fields.clone()));
                };
                for f in fields {
                    match map.get(f) {
                        Some(Value::String(s)) => put_str(&mut buf, &s.get()),
                        Some(Value::Number(n)) if n.is_i64() => {
                            put_int(&mut buf, n.as_i64().unwrap_or_default())
                        }
                        None | Some(Value::Null) => {
                            return Err(KeyError::Missing(f.clone()));
                        }
                        Some(other) => {
                            return Err(KeyError::NotAKey {
                                field: f.clone(),
                                kind: other.kind_name(),
                            });
                        }
                    }
                }
            }
        }
        Ok(XxHash3_128::oneshot(&buf))
    }

    /// Keys of every row of `columns` (one array per key column, in [`Self::columns`] order).
    /// `None` for a row with a null key part (not a row Floe wrote).
    pub fn of_columns(columns: &[ArrayRef]) -> Result<Vec<Option<KeyHash>>, String> {
        let rows = columns.first().map_or(0, |c| c.len());
        let mut out = Vec::with_capacity(rows);
        let mut buf = Vec::with_capacity(32);
        for row in 0..rows {
            buf.clear();
            let mut null = false;
            for c in columns {
                if c.is_null(row) {
                    null = true;
                    break;
                }
                match c.data_type() {
                    DataType::Int64 => put_int(&mut buf, c.as_primitive::<Int64Type>().value(row)),
                    DataType::Int32 => put_int(
                        &mut buf,
                        i64::from(c.as_primitive::<Int32Type>().value(row)),
                    ),
                    DataType::Utf8 => put_str(&mut buf, c.as_string::<i32>().value(row)),
                    DataType::LargeUtf8 => put_str(&mut buf, c.as_string::<i64>().value(row)),
                    DataType::Utf8View => put_str(&mut buf, c.as_string_view().value(row)),
                    other => return Err(format!("key column of type {other} is not supported")),
                }
            }
            out.push((!null).then(|| XxHash3_128::oneshot(&buf)));
        }
        Ok(out)
    }
}

fn put_int(buf: &mut Vec<u8>, v: i64) {
    buf.push(b'i');
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.push(b's');
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int32Array, Int64Array, StringArray};

    use super::*;

    use crate::record::json::JsonObject;

    fn map(v: serde_json::Value) -> JsonObject {
        JsonObject::from_map(v.as_object().unwrap())
    }

    #[test]
    fn json_and_arrow_give_the_same_digest() {
        let spec = KeySpec::from_config(&["id".into(), "region".into()]);
        let v = map(serde_json::json!({"id": 7, "region": "eu", "x": 1}));
        let k = spec.of_record(Some(v.view().root()), None).unwrap();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![7, 8])),
            Arc::new(StringArray::from(vec!["eu", "eu"])),
        ];
        let from_arrow = KeySpec::of_columns(&cols).unwrap();
        assert_eq!(from_arrow[0], Some(k));
        assert_ne!(from_arrow[1], Some(k));
        // An int column (Avro int, say) hashes like the same long.
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![7])),
            Arc::new(StringArray::from(vec!["eu"])),
        ];
        assert_eq!(KeySpec::of_columns(&cols).unwrap()[0], Some(k));
    }

    #[test]
    fn parts_do_not_run_into_each_other() {
        let spec = KeySpec::from_config(&["a".into(), "b".into()]);
        let k1 = spec.of_record(
            Some(map(serde_json::json!({"a": "x", "b": "yz"})).view().root()),
            None,
        );
        let k2 = spec.of_record(
            Some(map(serde_json::json!({"a": "xy", "b": "z"})).view().root()),
            None,
        );
        assert_ne!(k1.unwrap(), k2.unwrap());
        let k3 = spec.of_record(
            Some(map(serde_json::json!({"a": 1, "b": "z"})).view().root()),
            None,
        );
        let k4 = spec.of_record(
            Some(map(serde_json::json!({"a": "1", "b": "z"})).view().root()),
            None,
        );
        assert_ne!(k3.unwrap(), k4.unwrap(), "1 and \"1\" are different keys");
    }

    #[test]
    fn unusable_keys_are_explained() {
        let spec = KeySpec::from_config(&["id".into()]);
        let e = spec.of_record(None, None).unwrap_err().to_string();
        assert!(e.contains("tombstone"), "{e}");
        let e = spec
            .of_record(Some(map(serde_json::json!({"x": 1})).view().root()), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        let e = spec
            .of_record(
                Some(map(serde_json::json!({"id": 1.5})).view().root()),
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("string or an integer"), "{e}");
        let by_message = KeySpec::from_config(&[MESSAGE_KEY.into()]);
        assert_eq!(by_message, KeySpec::MessageKey);
        assert!(by_message.of_record(None, None).is_err());
        let tombstone = by_message.of_record(None, Some("k")).unwrap();
        let cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec!["k"]))];
        assert_eq!(KeySpec::of_columns(&cols).unwrap()[0], Some(tombstone));
    }
}
