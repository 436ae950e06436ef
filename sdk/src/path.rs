//! Dotted paths into nested JSON objects, such as `user.address.city`.
//!
//! A [`FieldPath`] names a key inside nested objects of a record: `user.address.city`
//! is the `city` key of the object under `address` of the object under `user`. Paths
//! only step through objects: a path through an array, a string or any other
//! non-object value finds nothing. There is no escaping, so a key that itself contains
//! a dot (`{"a.b": 1}`) cannot be named by a path (`a.b` means `{"a": {"b": ...}}`).
//!
//! Parse a path once (a config field of type `FieldPath` deserializes from the dotted
//! text) and use it on every record: with [`Record::get`](crate::Record::get) and
//! [`Patch`](crate::Patch) on the lazy record, or, on a record you parsed whole with
//! [`Record::to_map`](crate::Record::to_map), with the methods below:
//!
//! ```
//! use floe_sdk::path::FieldPath;
//! use floe_sdk::{Value, json, testing::object};
//!
//! let city = FieldPath::parse("user.address.city")?;
//! let mut record = object(json!({"user": {"address": {"city": "Oslo", "zip": "0150"}}}));
//!
//! assert_eq!(city.get(&record), Some(&json!("Oslo")));
//! if let Some(value) = city.get_mut(&mut record) {
//!     *value = json!("Bergen");
//! }
//! assert_eq!(city.remove(&mut record), Some(json!("Bergen")));
//! assert_eq!(Value::Object(record.clone()), json!({"user": {"address": {"zip": "0150"}}}));
//!
//! // Writing creates missing (or null) parent objects...
//! let geo = FieldPath::parse("geo.lat")?;
//! geo.insert(&mut record, json!(59.9)).map_err(|e| e.to_string())?;
//! assert_eq!(record["geo"], json!({"lat": 59.9}));
//!
//! // ...but never replaces a parent that holds something else.
//! let err = FieldPath::parse("user.address.zip.code")?
//!     .insert(&mut record, json!(1))
//!     .unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "cannot write `user.address.zip.code`: `user.address.zip` is a string, not an object"
//! );
//!
//! // Empty paths and empty segments are rejected.
//! assert!(FieldPath::parse("user..city").is_err());
//! # Ok::<(), String>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// A parsed dotted path (`user.address.city`) naming a key inside nested JSON objects.
///
/// A path has at least one segment and no segment is empty. It displays as the dotted
/// text it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath {
    /// Never empty; no segment is empty.
    segments: Vec<String>,
}

impl FieldPath {
    /// Parses a dotted path. The empty path, and a path with an empty segment
    /// (`.a`, `a.`, `a..b`), are errors.
    ///
    /// The error text is generic; a plugin that wants its own message (naming its
    /// config key, say) can replace it with `map_err`.
    pub fn parse(path: &str) -> Result<FieldPath, String> {
        if path.split('.').any(str::is_empty) {
            return Err(format!(
                "a field path must be keys joined by dots, like `user.name`, got {path:?}"
            ));
        }
        Ok(FieldPath {
            segments: path.split('.').map(str::to_string).collect(),
        })
    }

    /// The keys of the path, outermost first (`["user", "address", "city"]`).
    /// Never empty.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The last key (`city` for `user.address.city`): the key the path names inside
    /// its parent object.
    pub fn key(&self) -> &str {
        self.segments.last().expect("a path is never empty")
    }

    /// The keys of the parent objects (`["user", "address"]` for
    /// `user.address.city`); empty for a top-level field.
    pub fn parent_segments(&self) -> &[String] {
        &self.segments[..self.segments.len() - 1]
    }

    /// Whether `prefix` is this path or one of its ancestors (`user` and
    /// `user.address` are prefixes of `user.address.city`; `us` is not).
    pub fn starts_with(&self, prefix: &FieldPath) -> bool {
        self.segments.starts_with(&prefix.segments)
    }

    /// The object holding the path's last key: the record itself for a top-level
    /// field. `None` if a parent is missing or not an object.
    pub fn parent_object<'a>(
        &self,
        record: &'a Map<String, Value>,
    ) -> Option<&'a Map<String, Value>> {
        let mut map = record;
        for key in self.parent_segments() {
            map = map.get(key)?.as_object()?;
        }
        Some(map)
    }

    /// The object holding the path's last key, mutably; see [`FieldPath::parent_object`].
    pub fn parent_object_mut<'a>(
        &self,
        record: &'a mut Map<String, Value>,
    ) -> Option<&'a mut Map<String, Value>> {
        let mut map = record;
        for key in self.parent_segments() {
            map = map.get_mut(key)?.as_object_mut()?;
        }
        Some(map)
    }

    /// The value at the path, if every parent exists and is an object and the last
    /// key is present. A JSON `null` there is returned as `Some(&Value::Null)`.
    pub fn get<'a>(&self, record: &'a Map<String, Value>) -> Option<&'a Value> {
        self.parent_object(record)?.get(self.key())
    }

    /// The value at the path, mutably; see [`FieldPath::get`].
    pub fn get_mut<'a>(&self, record: &'a mut Map<String, Value>) -> Option<&'a mut Value> {
        self.parent_object_mut(record)?.get_mut(self.key())
    }

    /// Removes the value at the path and returns it, keeping the order of the other
    /// keys of its parent object. Parent objects are left in place, even if they
    /// become empty. Nothing happens (and `None` is returned) if the value is absent
    /// or a parent is missing or not an object.
    pub fn remove(&self, record: &mut Map<String, Value>) -> Option<Value> {
        self.parent_object_mut(record)?.shift_remove(self.key())
    }

    /// Writes `value` at the path and returns the value it replaced, if any.
    ///
    /// Missing parents, and parents holding `null`, become empty objects; a new parent
    /// or key is added at the end of its object, while a replaced value keeps its
    /// position. A parent that holds anything else (a string, a number, an array...)
    /// is never replaced: that is an [`InsertError`], and the record is left unchanged.
    pub fn insert(
        &self,
        record: &mut Map<String, Value>,
        value: Value,
    ) -> Result<Option<Value>, InsertError> {
        let parents = self.parent_segments();
        let mut map = record;
        for (i, key) in parents.iter().enumerate() {
            let slot = map.entry(key.clone()).or_insert(Value::Null);
            if slot.is_null() {
                *slot = Value::Object(Map::new());
            }
            map = match slot {
                Value::Object(inner) => inner,
                other => {
                    return Err(InsertError {
                        path: self.clone(),
                        parent: FieldPath {
                            segments: parents[..=i].to_vec(),
                        },
                        kind: kind(other),
                    });
                }
            };
        }
        Ok(map.insert(self.key().to_string(), value))
    }
}

/// Displays the dotted text (`user.address.city`), which parses back to the same path.
impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(segment)?;
        }
        Ok(())
    }
}

/// Deserializes from the dotted text, refusing what [`FieldPath::parse`] refuses.
impl<'de> serde::Deserialize<'de> for FieldPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FieldPath, D::Error> {
        let text = String::deserialize(d)?;
        FieldPath::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Serializes as the dotted text.
impl serde::Serialize for FieldPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Same as [`FieldPath::parse`].
impl FromStr for FieldPath {
    type Err = String;

    fn from_str(path: &str) -> Result<FieldPath, String> {
        FieldPath::parse(path)
    }
}

/// [`FieldPath::insert`] found a parent that is neither an object, null, nor missing.
///
/// Displays as ``cannot write `user.name`: `user` is a string, not an object``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertError {
    path: FieldPath,
    parent: FieldPath,
    kind: &'static str,
}

impl InsertError {
    /// The path that could not be written (`user.name`).
    pub fn path(&self) -> &FieldPath {
        &self.path
    }

    /// The parent in the way (`user`), a prefix of [`InsertError::path`].
    pub fn parent(&self) -> &FieldPath {
        &self.parent
    }

    /// What the parent holds instead of an object, with its article: `"a boolean"`,
    /// `"a number"`, `"a string"` or `"an array"`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot write `{}`: `{}` is {}, not an object",
            self.path, self.parent, self.kind
        )
    }
}

impl std::error::Error for InsertError {}

/// The kind of a JSON value with its article, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::object;

    fn path(text: &str) -> FieldPath {
        FieldPath::parse(text).unwrap()
    }

    fn keys(map: &Map<String, Value>) -> Vec<&str> {
        map.keys().map(String::as_str).collect()
    }

    #[test]
    fn parses_and_displays() {
        let p = path("user.address.city");
        assert_eq!(p.segments(), ["user", "address", "city"]);
        assert_eq!(p.key(), "city");
        assert_eq!(p.parent_segments(), ["user", "address"]);
        assert_eq!(p.to_string(), "user.address.city");
        assert_eq!("user.address.city".parse::<FieldPath>(), Ok(p));

        let top = path("id");
        assert_eq!(top.segments(), ["id"]);
        assert_eq!(top.key(), "id");
        assert!(top.parent_segments().is_empty());
        assert_eq!(top.to_string(), "id");

        // Anything but the dot is part of a key.
        let odd = path(" a b/c-d ");
        assert_eq!(odd.segments(), [" a b/c-d "]);
    }

    #[test]
    fn rejects_empty_paths_and_segments() {
        for bad in ["", ".", "..", ".a", "a.", "a..b", "a.b."] {
            let err = FieldPath::parse(bad).unwrap_err();
            assert!(err.contains("keys joined by dots"), "{bad:?}: {err}");
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
            assert!(bad.parse::<FieldPath>().is_err());
        }
    }

    #[test]
    fn starts_with() {
        let p = path("user.address.city");
        assert!(p.starts_with(&path("user")));
        assert!(p.starts_with(&path("user.address")));
        assert!(p.starts_with(&p));
        assert!(!p.starts_with(&path("us")));
        assert!(!p.starts_with(&path("address")));
        assert!(!path("user").starts_with(&p));
    }

    #[test]
    fn gets_top_level_and_nested_values() {
        let record =
            object(json!({"a": 1, "n": null, "user": {"name": "ann", "geo": {"lat": 1.5}}}));
        assert_eq!(path("a").get(&record), Some(&json!(1)));
        assert_eq!(path("n").get(&record), Some(&Value::Null));
        assert_eq!(path("user.name").get(&record), Some(&json!("ann")));
        assert_eq!(path("user.geo.lat").get(&record), Some(&json!(1.5)));
        assert_eq!(path("user.geo").get(&record), Some(&json!({"lat": 1.5})));
        assert_eq!(path("missing").get(&record), None);
        assert_eq!(path("user.missing").get(&record), None);
        assert_eq!(path("missing.name").get(&record), None);
    }

    #[test]
    fn paths_through_non_objects_find_nothing() {
        let record = object(json!({"s": "text", "n": null, "l": [{"x": 1}], "k": 3, "b": true}));
        for p in ["s.x", "n.x", "l.x", "l.0", "l.0.x", "k.x", "b.x", "s.x.y"] {
            assert_eq!(path(p).get(&record), None, "{p}");
            let mut copy = record.clone();
            assert_eq!(path(p).get_mut(&mut copy), None, "{p}");
            assert_eq!(path(p).remove(&mut copy), None, "{p}");
            assert_eq!(copy, record, "{p}");
        }
        // Dotted keys are not reachable: the dot always separates keys.
        let record = object(json!({"a.b": 1}));
        assert_eq!(path("a.b").get(&record), None);
    }

    #[test]
    fn get_mut_changes_in_place() {
        let mut record = object(json!({"a": 1, "user": {"id": 7, "x": 0}, "z": 2}));
        *path("user.id").get_mut(&mut record).unwrap() = json!("seven");
        *path("a").get_mut(&mut record).unwrap() = json!([1]);
        assert_eq!(
            Value::Object(record.clone()),
            json!({"a": [1], "user": {"id": "seven", "x": 0}, "z": 2})
        );
        assert_eq!(keys(&record), ["a", "user", "z"]);
        assert_eq!(keys(record["user"].as_object().unwrap()), ["id", "x"]);
        assert!(path("user.missing").get_mut(&mut record).is_none());
    }

    #[test]
    fn parent_objects() {
        let mut record = object(json!({"a": 1, "user": {"id": 7}}));
        assert_eq!(path("a").parent_object(&record), Some(&record));
        assert_eq!(path("missing").parent_object(&record), Some(&record));
        assert_eq!(
            path("user.id").parent_object(&record),
            record["user"].as_object()
        );
        assert_eq!(path("a.b").parent_object(&record), None);
        assert_eq!(path("x.y").parent_object(&record), None);
        path("user.name")
            .parent_object_mut(&mut record)
            .unwrap()
            .insert("name".into(), json!("ann"));
        assert_eq!(record["user"], json!({"id": 7, "name": "ann"}));
    }

    #[test]
    fn remove_keeps_the_order_of_the_rest() {
        let mut record = object(json!({"a": 1, "b": 2, "c": 3, "user": {"x": 1, "y": 2, "z": 3}}));
        assert_eq!(path("b").remove(&mut record), Some(json!(2)));
        assert_eq!(path("user.x").remove(&mut record), Some(json!(1)));
        assert_eq!(keys(&record), ["a", "c", "user"]);
        assert_eq!(keys(record["user"].as_object().unwrap()), ["y", "z"]);
        assert_eq!(path("b").remove(&mut record), None);
        assert_eq!(path("user.q").remove(&mut record), None);
        assert_eq!(path("q.user").remove(&mut record), None);
        // Emptied parents stay.
        let mut record = object(json!({"user": {"name": "ann"}, "n": null}));
        assert_eq!(path("user.name").remove(&mut record), Some(json!("ann")));
        assert_eq!(path("n").remove(&mut record), Some(Value::Null));
        assert_eq!(Value::Object(record), json!({"user": {}}));
    }

    #[test]
    fn insert_adds_replaces_and_creates_parents() {
        let mut record = object(json!({"a": 1, "geo": {"lat": 0}, "z": 2}));
        assert_eq!(path("b").insert(&mut record, json!(3)), Ok(None));
        assert_eq!(path("a").insert(&mut record, json!(9)), Ok(Some(json!(1))));
        assert_eq!(path("geo.lon").insert(&mut record, json!(5)), Ok(None));
        assert_eq!(
            path("geo.lat").insert(&mut record, json!(4)),
            Ok(Some(json!(0)))
        );
        assert_eq!(
            path("meta.deep.ts").insert(&mut record, json!("t")),
            Ok(None)
        );
        assert_eq!(
            Value::Object(record.clone()),
            json!({"a": 9, "geo": {"lat": 4, "lon": 5}, "z": 2, "b": 3, "meta": {"deep": {"ts": "t"}}})
        );
        // A replaced value keeps its place, new keys and parents go last.
        assert_eq!(keys(&record), ["a", "geo", "z", "b", "meta"]);
        assert_eq!(keys(record["geo"].as_object().unwrap()), ["lat", "lon"]);
    }

    #[test]
    fn insert_replaces_null_parents_in_place() {
        let mut record = object(json!({"meta": null, "z": 1}));
        assert_eq!(path("meta.a.b").insert(&mut record, json!(1)), Ok(None));
        assert_eq!(
            Value::Object(record.clone()),
            json!({"meta": {"a": {"b": 1}}, "z": 1})
        );
        assert_eq!(keys(&record), ["meta", "z"]);
        // A null at the path itself is just replaced.
        let mut record = object(json!({"ts": null}));
        assert_eq!(
            path("ts").insert(&mut record, json!(1)),
            Ok(Some(Value::Null))
        );
    }

    #[test]
    fn insert_through_a_non_object_fails_leaving_the_record_alone() {
        for (parent, kind) in [
            (json!("bob"), "a string"),
            (json!(1), "a number"),
            (json!(false), "a boolean"),
            (json!([1]), "an array"),
        ] {
            let record = object(json!({"user": parent}));
            let mut copy = record.clone();
            let err = path("user.name")
                .insert(&mut copy, json!("ann"))
                .unwrap_err();
            assert_eq!(copy, record);
            assert_eq!(err.path(), &path("user.name"));
            assert_eq!(err.parent(), &path("user"));
            assert_eq!(err.kind(), kind);
            assert_eq!(
                err.to_string(),
                format!("cannot write `user.name`: `user` is {kind}, not an object")
            );
        }
        let record = object(json!({"a": {"b": 2}, "x": {"y": null}}));
        let mut copy = record.clone();
        let err = path("a.b.c").insert(&mut copy, json!(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot write `a.b.c`: `a.b` is a number, not an object"
        );
        let err = path("a.b.c.d").insert(&mut copy, json!(1)).unwrap_err();
        assert_eq!(err.parent(), &path("a.b"));
        assert_eq!(copy, record);
        // An error is a std error, usable with `?` in functions returning `Box<dyn Error>`.
        let boxed: Box<dyn std::error::Error> = Box::new(err);
        assert!(boxed.to_string().starts_with("cannot write `a.b.c.d`"));
    }
}
