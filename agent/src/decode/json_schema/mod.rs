//! JSON Schema values (registry schema type `JSON`, Confluent wire format, or plain JSON
//! with a schema file) -> the JSON text of the record, with the columns the schema declares.
//!
//! Each message is validated with the `jsonschema` crate. A message that does not match
//! its schema follows `on_incompatible`: `dead_letter` and `fail` report
//! [`DecodeError::Invalid`]; `coerce` writes it anyway and lets the schema stage check
//! its values against the declared columns (a value that conflicts with a `string`
//! column becomes its JSON text, anything else that does not fit is dead-lettered).
//!
//! The text written keeps the payload as it is except where a declared type needs a
//! canonical form: `date-time` strings are normalized to UTC with `Z` (microseconds),
//! `uuid`s to lowercase, integral floats in `integer` fields to integers, and values of
//! multi-kind fields (stored as `string`) to their JSON text.
//!
//! The `jsonschema` validator reads a `serde_json::Value`, so this path parses each
//! message into one (the only DOM of the decoders); `jsonschema` also validates custom
//! in-memory representations, which the pipeline's parsed-JSON tape can implement later.

mod types;

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::StructType;
use serde_json::Value;

pub use self::types::JsonSchemaMappingError;
use self::types::{Docs, Plan, struct_of};
use super::DecodeError;
use super::text;

/// A parsed JSON schema: its validator, the columns it declares and how to write values.
pub struct JsonSchemaDoc {
    /// Registry id (`None` for a schema file).
    pub id: Option<u32>,
    validator: jsonschema::Validator,
    plan: Plan,
    /// The columns of a top-level `object` schema (none for other schemas, e.g. keys).
    pub columns: Arc<StructType>,
}

impl std::fmt::Debug for JsonSchemaDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchemaDoc")
            .field("id", &self.id)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// The URI a reference name is known by: an absolute URI as it is, a relative name
/// (`address.json`) under the validator's default base, as a relative `$ref` resolves.
fn reference_uri(name: &str) -> String {
    if name.contains(':') {
        name.to_string()
    } else {
        format!("json-schema:///{name}")
    }
}

impl JsonSchemaDoc {
    /// Parses a JSON schema (`text`) whose `$ref`s may name `references` (reference
    /// name, schema text), e.g. the schemas of other registry subjects.
    pub fn parse(
        id: Option<u32>,
        text: &str,
        references: &[(String, String)],
    ) -> Result<JsonSchemaDoc, DecodeError> {
        let bad = |reason: String| DecodeError::BadSchema { id, reason };
        let root: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let mut refs = HashMap::new();
        for (name, text) in references {
            let value: Value = serde_json::from_str(text)
                .map_err(|e| bad(format!("reference {name} is not JSON: {e}")))?;
            refs.insert(name.clone(), value);
        }
        let validator = if refs.is_empty() {
            jsonschema::options().build(&root)
        } else {
            let registry = jsonschema::Registry::new()
                .extend(
                    refs.iter()
                        .map(|(name, v)| (reference_uri(name), v.clone())),
                )
                .and_then(|b| b.prepare())
                .map_err(|e| bad(format!("schema references: {e}")))?;
            jsonschema::options().with_registry(&registry).build(&root)
        }
        .map_err(|e| bad(format!("not a usable JSON schema: {e}")))?;
        let plan = Docs {
            root: &root,
            references: &refs,
        }
        .plan()
        .map_err(|e| bad(e.to_string()))?;
        let columns = match &plan {
            Plan::Object(props) => struct_of(props),
            _ => StructType::new(Vec::new()),
        };
        Ok(JsonSchemaDoc {
            id,
            validator,
            plan,
            columns: Arc::new(columns),
        })
    }

    /// Whether the schema describes an object (a row) rather than a single value.
    pub fn is_object(&self) -> bool {
        matches!(self.plan, Plan::Object(_))
    }

    /// Parses and validates one message (no header) and appends its JSON text to `out`.
    /// With `validate` false (the `coerce` policy) a message that does not match is
    /// written anyway, its values as they are where they do not fit.
    pub fn decode(
        &self,
        bytes: &[u8],
        validate: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::NotJson(e.to_string()))?;
        if validate && let Err(e) = self.validator.validate(&value) {
            let path = e.instance_path().to_string();
            return Err(self.invalid(format!(
                "{}{}",
                if path.is_empty() {
                    String::new()
                } else {
                    format!("at {path}: ")
                },
                e.masked()
            )));
        }
        write(&self.plan, &value, validate, out).map_err(|e| self.invalid(e.to_string()))
    }

    /// Parses and validates a key; its text: a string as it is, anything else as JSON text.
    pub fn decode_key(&self, bytes: &[u8], validate: bool) -> Result<String, DecodeError> {
        let mut out = Vec::new();
        self.decode(bytes, validate, &mut out)?;
        let value: Value = serde_json::from_slice(&out).expect("written JSON parses");
        Ok(match value {
            Value::String(s) => s,
            other => other.to_string(),
        })
    }

    fn invalid(&self, reason: String) -> DecodeError {
        DecodeError::Invalid {
            id: self.id,
            reason,
            stop: false,
        }
    }
}

/// Why a validated value cannot be written by its plan.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// A value its declared format cannot hold (`date-time`, `uuid`, ...).
    #[error("{value} is not a valid {what}")]
    Unfit {
        /// The value (its JSON text, shortened).
        value: String,
        /// What the schema declares.
        what: &'static str,
    },
    /// An error inside a member or element.
    #[error("at /{at}: {inner}")]
    At {
        /// The member's key or the element's index.
        at: String,
        /// What is wrong there.
        #[source]
        inner: Box<WriteError>,
    },
}

impl WriteError {
    /// This error, found at member or element `at` of the value.
    fn at(self, at: &str) -> WriteError {
        WriteError::At {
            at: at.to_string(),
            inner: Box::new(self),
        }
    }
}

/// Writes `v` by `plan`. With `strict` (validated), a value a declared format cannot
/// hold is an error; otherwise it is written as it is.
/// Writes `members` as a JSON object, each value by `member` (an error names its key).
fn write_members(
    members: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
    mut member: impl FnMut(&str, &Value, &mut Vec<u8>) -> Result<(), WriteError>,
) -> Result<(), WriteError> {
    out.push(b'{');
    for (i, (name, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        text::string(out, name);
        out.push(b':');
        member(name, value, out).map_err(|e| e.at(name))?;
    }
    out.push(b'}');
    Ok(())
}

fn write(plan: &Plan, v: &Value, strict: bool, out: &mut Vec<u8>) -> Result<(), WriteError> {
    let as_is = |out: &mut Vec<u8>| {
        serde_json::to_writer(&mut *out, v).expect("writing JSON into a Vec cannot fail");
        Ok(())
    };
    let unfit = |what: &'static str, out: &mut Vec<u8>| {
        if strict {
            Err(WriteError::Unfit {
                value: short(v),
                what,
            })
        } else {
            as_is(out)
        }
    };
    if v.is_null() {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match (plan, v) {
        (Plan::Long, Value::Number(n)) if !n.is_i64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => {
                text::int(out, f as i64);
                Ok(())
            }
            _ => unfit("long (64-bit integer)", out),
        },
        (Plan::Timestamptz, Value::String(s)) => match chrono::DateTime::parse_from_rfc3339(s) {
            Ok(t) if text::timestamp_micros(out, t.timestamp_micros()) => Ok(()),
            _ => unfit("date-time", out),
        },
        (Plan::Date, Value::String(s)) => {
            if chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() {
                as_is(out)
            } else {
                unfit("date", out)
            }
        }
        (Plan::Uuid, Value::String(s)) => match uuid::Uuid::parse_str(s) {
            Ok(u) => {
                text::string(out, &u.hyphenated().to_string());
                Ok(())
            }
            Err(_) => unfit("uuid", out),
        },
        (Plan::JsonText, Value::String(_)) => as_is(out),
        (Plan::JsonText, other) => {
            text::string(out, &other.to_string());
            Ok(())
        }
        (Plan::Object(props), Value::Object(members)) => {
            write_members(members, out, |name, member, out| {
                match props.iter().find(|p| p.name == name) {
                    Some(p) => write(&p.plan, member, strict, out),
                    None => {
                        serde_json::to_writer(&mut *out, member)
                            .expect("writing JSON into a Vec cannot fail");
                        Ok(())
                    }
                }
            })
        }
        (Plan::List(item), Value::Array(items)) => {
            out.push(b'[');
            for (i, element) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, element, strict, out).map_err(|e| e.at(&i.to_string()))?;
            }
            out.push(b']');
            Ok(())
        }
        (Plan::Map(value), Value::Object(members)) => {
            write_members(members, out, |_, member, out| {
                write(value, member, strict, out)
            })
        }
        // Kinds the validator accepted for a plain column, and mismatches under `coerce`
        // (the schema stage checks them against the column).
        _ => as_is(out),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}...", &s[..s.floor_char_boundary(57)])
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
