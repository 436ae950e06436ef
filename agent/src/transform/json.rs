//! Stand-in for `crate::record::json` (a parsed JSON object: its text and a token
//! tape, parsed once), with the same API, until that module lands. This one keeps the
//! text only and validates it with `serde_json`; patches are applied to the text with
//! `floe_sdk::json::{set, remove}`, the functions the SDK's test harness uses, so
//! plugins see the same results in tests and in the agent.

use std::fmt;

/// A JSON object: its UTF-8 text, checked once.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonObject {
    text: Vec<u8>,
}

impl fmt::Debug for JsonObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonObject({})", String::from_utf8_lossy(&self.text))
    }
}

/// Why text is not a JSON object, or a patch cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

/// One change to an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOp {
    /// Sets the field at `path` (intermediate objects are created) to one JSON value
    /// given as text.
    Set {
        /// Object keys, outermost first.
        path: Vec<String>,
        /// One JSON value's text.
        value: Vec<u8>,
    },
    /// Removes the field at `path` if present.
    Remove {
        /// Object keys, outermost first.
        path: Vec<String>,
    },
}

fn check_value(text: &[u8]) -> Result<(), JsonError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| JsonError(format!("not valid JSON: {e}")))
}

impl JsonObject {
    /// Parses `bytes`, which must hold one JSON object.
    pub fn parse(bytes: Vec<u8>) -> Result<JsonObject, JsonError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            check_value(&bytes)?;
            return Err(JsonError("not a JSON object".into()));
        }
        check_value(&bytes)?;
        Ok(JsonObject { text: bytes })
    }

    /// The object's text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }

    /// A new object with the patch applied (the input is unchanged).
    pub fn apply(&self, ops: &[PatchOp]) -> Result<JsonObject, JsonError> {
        let mut text = self.text.clone();
        for op in ops {
            match op {
                PatchOp::Set { path, value } => {
                    if path.is_empty() {
                        return Err(JsonError("a patch path has no keys".into()));
                    }
                    check_value(value)?;
                    text = floe_sdk::json::set(&text, path.as_slice(), value)
                        .map_err(|e| JsonError(e.to_string()))?;
                }
                PatchOp::Remove { path } => {
                    if path.is_empty() {
                        return Err(JsonError("a patch path has no keys".into()));
                    }
                    if let Some(t) = floe_sdk::json::remove(&text, path.as_slice()) {
                        text = t;
                    }
                }
            }
        }
        Ok(JsonObject { text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_objects_only_and_applies_patches() {
        assert!(JsonObject::parse(b" {\"a\": 1} ".to_vec()).is_ok());
        assert_eq!(
            JsonObject::parse(b"[1]".to_vec()).unwrap_err().to_string(),
            "not a JSON object"
        );
        assert!(
            JsonObject::parse(b"{".to_vec())
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
        let o = JsonObject::parse(br#"{"a": 1, "b": {"c": 2}}"#.to_vec()).unwrap();
        let p = o
            .apply(&[
                PatchOp::Set {
                    path: vec!["b".into(), "d".into()],
                    value: b"true".to_vec(),
                },
                PatchOp::Remove {
                    path: vec!["a".into()],
                },
                PatchOp::Remove {
                    path: vec!["zz".into()],
                },
            ])
            .unwrap();
        assert_eq!(p.as_bytes(), br#"{"b": {"c": 2,"d":true}}"#);
        assert_eq!(
            o.as_bytes(),
            br#"{"a": 1, "b": {"c": 2}}"#,
            "the input is unchanged"
        );
        let e = o
            .apply(&[PatchOp::Set {
                path: vec!["a".into(), "x".into()],
                value: b"1".to_vec(),
            }])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot write `a.x`: `a` is a number, not an object"
        );
        assert!(
            o.apply(&[PatchOp::Set {
                path: vec!["a".into()],
                value: b"nope".to_vec()
            }])
            .is_err()
        );
    }
}
