//! `redact`: removes, hashes or masks sensitive fields.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "redact"   # redact.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! drop = ["email", "user.ssn"]   # remove these fields
//! hash = ["user_id"]             # replace with hex SHA-256 of salt + value
//! salt = "s3cr3t"                # optional, default ""
//! mask = ["card"]                # "4111111111111111" -> "***1111"
//! ```
//!
//! - `drop` (optional, list of dotted paths): the fields are removed.
//! - `hash` (optional, list of dotted paths): the value is replaced by the lowercase
//!   hex SHA-256 of `salt` followed by the value's text: a string's raw text, any other
//!   value's compact JSON text (`42`, `true`, `{"a":1}` with keys in record order).
//!   The same value and salt always give the same hash, so hashed ids still join.
//! - `salt` (optional string, default `""`): prepended to every hashed value.
//! - `mask` (optional, list of dotted paths): a string becomes `"***"` followed by
//!   its last 4 characters (`"4111111111111111"` -> `"***1111"`); a string of 4
//!   characters or fewer becomes `"***"` alone, so it is never shown whole. A number
//!   is masked like its JSON text (and becomes a string); booleans, arrays and objects
//!   become `"***"`.
//!
//! A dotted path (`user.ssn`) names a key inside nested objects. Missing fields (and
//! paths through something that is not an object) are ignored, and a JSON `null` is
//! left as it is by `hash` and `mask` (there is nothing to hide, and a constant hash
//! would look like a real value). Masking runs first, then hashing, then dropping.
//! At least one of `drop`, `hash`, `mask` must be given; a path listed under two of
//! them, an empty path or an unknown key fails `init`.
//!
//! The answer is a patch (the agent sets and removes the fields in its own copy of the
//! record); only when a `mask` or `hash` path lies inside another one does the plugin
//! rebuild the record itself, to apply them one after the other.

use floe_sdk::json::Json;
use floe_sdk::path::FieldPath;
use floe_sdk::{Answer, Emit, Error, Patch, Record, Value, map};
use serde::Deserialize;

/// Masks, hashes and drops the configured fields.
#[map(Redact)]
fn redact(record: &Record, config: &Config) -> Result<Answer, Error> {
    if config.nested {
        return config.rebuild(record);
    }
    // Every path's value, found in one pass over the record (on the stack for the
    // usual few paths: allocating costs a WebAssembly guest).
    let paths = config.mask.len() + config.hash.len() + config.drop.len();
    let mut few = [None; 8];
    let mut many = Vec::new();
    let found: &mut [Option<Json>] = match few.get_mut(..paths) {
        Some(f) => f,
        None => {
            many.resize(paths, None);
            &mut many
        }
    };
    config.find(record, found);
    let (mask, rest) = found.split_at(config.mask.len());
    let (hash, drop) = rest.split_at(config.hash.len());

    let mut patch = Patch::new();
    for (path, v) in config.mask.iter().zip(mask) {
        if let Some(v) = v.filter(|v| !v.is_null()) {
            patch = patch.set(path, mask_value(&v.to_value()?));
        }
    }
    for (path, v) in config.hash.iter().zip(hash) {
        if let Some(v) = v.filter(|v| !v.is_null()) {
            // A string is hashed from its text as it is, without building a value
            // (without even unescaping or checking it when it holds no escape).
            let hashed = if let Some(bytes) = v.plain_str() {
                quoted_hash(&config.salt, bytes)
            } else if let Some(text) = v.as_str() {
                quoted_hash(&config.salt, text.as_bytes())
            } else {
                quoted_hash(&config.salt, v.to_value()?.to_string().as_bytes())
            };
            patch = patch.set_json(path, &hashed);
        }
    }
    for (path, v) in config.drop.iter().zip(drop) {
        if v.is_some() {
            patch = patch.remove(path);
        }
    }
    Ok(patch.into())
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    drop: Vec<FieldPath>,
    hash: Vec<FieldPath>,
    mask: Vec<FieldPath>,
    salt: String,
    /// Whether a `mask` or `hash` path lies inside another `mask` or `hash` path, so
    /// that they must be applied one after the other on the whole record.
    nested: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    drop: Vec<String>,
    #[serde(default)]
    hash: Vec<String>,
    #[serde(default)]
    mask: Vec<String>,
    #[serde(default)]
    salt: String,
}

/// How many trailing characters `mask` keeps.
const MASK_KEEP: usize = 4;
/// What `mask` puts in front of the kept characters.
const MASK: &str = "***";

fn parse_paths(list: &[String], name: &str) -> Result<Vec<FieldPath>, String> {
    list.iter()
        .map(|field| {
            FieldPath::parse(field).map_err(|_| {
                format!(
                    "redact: `{name}` entries must be dotted paths like `user.ssn`, got {field:?}"
                )
            })
        })
        .collect()
}

/// Lowercase hex SHA-256 of `salt` + the value's text.
pub fn hash_value(salt: &str, value: &Value) -> String {
    match value {
        Value::String(s) => hash_text(salt, s),
        other => hash_text(salt, &other.to_string()),
    }
}

/// Lowercase hex SHA-256 of `salt` followed by `text`.
pub fn hash_text(salt: &str, text: &str) -> String {
    let quoted = quoted_hash(salt, text.as_bytes());
    String::from_utf8(quoted[1..65].to_vec()).expect("hex digits are ASCII")
}

/// [`hash_text`] as a JSON string (the hex in quotes: it needs no escaping), built
/// without allocating: what a patch sets.
fn quoted_hash(salt: &str, text: &[u8]) -> [u8; 66] {
    // The agent hashes (`floe_sdk::hash`) in native code: compiled into the plugin,
    // SHA-256 would be most of its work per record.
    let digest = floe_sdk::hash::sha256_parts(&[salt.as_bytes(), text]);
    let mut out = [b'"'; 66];
    let hex = (&mut out[1..65]).try_into().expect("64 bytes");
    floe_sdk::hash::hex_into(&digest, hex);
    out
}

/// `"***"` + the last 4 characters of `text`, or `"***"` alone for short text.
pub fn mask_text(text: &str) -> String {
    let count = text.chars().count();
    if count <= MASK_KEEP {
        return MASK.to_string();
    }
    let start = text
        .char_indices()
        .nth(count - MASK_KEEP)
        .map_or(0, |(i, _)| i);
    format!("{MASK}{}", &text[start..])
}

fn mask_value(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(mask_text(s)),
        Value::Number(n) => Value::String(mask_text(&n.to_string())),
        _ => Value::String(MASK.to_string()),
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
        if raw.drop.is_empty() && raw.hash.is_empty() && raw.mask.is_empty() {
            return Err("redact: nothing to do; give `drop`, `hash` and/or `mask`".to_string());
        }
        let lists = [
            ("drop", &raw.drop),
            ("hash", &raw.hash),
            ("mask", &raw.mask),
        ];
        for (i, (a, list_a)) in lists.iter().enumerate() {
            for (b, list_b) in &lists[i + 1..] {
                if let Some(both) = list_a.iter().find(|f| list_b.contains(f)) {
                    return Err(format!(
                        "redact: `{both}` is listed under both `{a}` and `{b}`"
                    ));
                }
            }
        }
        let hash = parse_paths(&raw.hash, "hash")?;
        let mask = parse_paths(&raw.mask, "mask")?;
        let changed: Vec<&FieldPath> = mask.iter().chain(&hash).collect();
        let nested = changed.iter().enumerate().any(|(i, a)| {
            changed
                .iter()
                .enumerate()
                .any(|(j, b)| i != j && a.starts_with(b))
        });
        Ok(Config {
            drop: parse_paths(&raw.drop, "drop")?,
            hash,
            mask,
            salt: raw.salt,
            nested,
        })
    }
}

impl Config {
    /// The values at the `mask`, `hash` and `drop` paths, in that order, into `found`
    /// (one per path): one pass over the record's top-level fields, each path's rest
    /// looked up under the field it starts with.
    fn find<'r>(&self, record: &Record<'r>, found: &mut [Option<Json<'r>>]) {
        let paths = self.mask.iter().chain(&self.hash).chain(&self.drop);
        for (key, value) in record.fields() {
            for (path, slot) in paths.clone().zip(found.iter_mut()) {
                let (first, rest) = path.segments().split_first().expect("paths are not empty");
                if slot.is_none() && key.is(first) {
                    *slot = value.get(rest);
                }
            }
        }
    }

    /// Masks, hashes and drops one after the other on the whole record.
    fn rebuild(&self, record: &Record) -> Result<Answer, Error> {
        let mut value = record.to_map()?;
        for path in &self.mask {
            if let Some(v) = path.get_mut(&mut value).filter(|v| !v.is_null()) {
                *v = mask_value(v);
            }
        }
        for path in &self.hash {
            if let Some(v) = path.get_mut(&mut value).filter(|v| !v.is_null()) {
                *v = Value::String(hash_value(&self.salt, v));
            }
        }
        for path in &self.drop {
            path.remove(&mut value);
        }
        Ok(Emit::new(value).into())
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::{Answered, Harness, Output, object};
    use floe_sdk::{Value, json};

    use super::*;

    fn redact(config: Value) -> Harness<Redact> {
        Harness::new(config).unwrap()
    }

    fn init_error(config: Value) -> String {
        Harness::<Redact>::init_error(config)
    }

    #[test]
    fn drops_top_level_and_nested_fields_keeping_order() {
        let mut h = redact(json!({"drop": ["email", "user.ssn"]}));
        let out = h.run_one(
            json!({"a": 1, "email": "x@y", "user": {"name": "n", "ssn": "123", "z": 2}, "b": 3}),
        );
        assert_eq!(out, json!({"a": 1, "user": {"name": "n", "z": 2}, "b": 3}));
        let keys: Vec<_> = out.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["a", "user", "b"]);
        let keys: Vec<_> = out["user"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["name", "z"]);
    }

    #[test]
    fn drops_whole_objects_and_nulls() {
        let mut h = redact(json!({"drop": ["user", "n"]}));
        assert_eq!(
            h.run_one(json!({"user": {"ssn": 1}, "n": null, "k": 0})),
            json!({"k": 0})
        );
    }

    #[test]
    fn missing_fields_are_ignored() {
        let mut h = redact(
            json!({"drop": ["email", "user.ssn"], "hash": ["id", "a.b.c"], "mask": ["card"]}),
        );
        let record = json!({"other": 1, "user": "not an object", "a": {"b": 5}});
        assert_eq!(h.run_one(record.clone()), record);
        assert_eq!(h.run_one(json!({})), json!({}));
    }

    #[test]
    fn hashes_strings_as_raw_text_with_salt() {
        let mut h = redact(json!({"hash": ["user_id"]}));
        assert_eq!(
            h.run_one(json!({"user_id": "abc", "k": 1})),
            json!({"user_id": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "k": 1})
        );
        let mut h = redact(json!({"hash": ["user_id"], "salt": "pepper"}));
        assert_eq!(
            h.run_one(json!({"user_id": "u-42"})),
            json!({"user_id": "d5edbbd3f8a9c935546d328a403d50aff769f7a8dcabe236880002f7fa7730ab"})
        );
    }

    #[test]
    fn hashes_other_values_as_json_text() {
        let mut h = redact(json!({"hash": ["n", "o", "l"]}));
        let out = h.run_one(json!({"n": 42, "o": {"a": 1, "b": [true, null]}, "l": [1, 2]}));
        assert_eq!(
            out,
            json!({
                "n": "73475cb40a568e8da8a045ced110137e159f890ac4da883b6b17dc651b3a8049",
                "o": "1cc69c7fa23616ca2ec3ee70d24390a6225c8832db8a4c814c7e0e7f942f8668",
                "l": "49a64717d5d4cb19952e6eac2946415cf6879adacf9908e7d872332d32c6e684",
            })
        );
        let mut h = redact(json!({"hash": ["user.id"], "salt": "pepper"}));
        assert_eq!(
            h.run_one(json!({"user": {"id": 42, "name": "n"}})),
            json!({"user": {"id": "93ca73bec2907ec825519db1f7ee28cb033d71c83d14b76ef78b0c4e64566e6e", "name": "n"}})
        );
        // A number and the string of its digits hash alike (both texts are `42`).
        assert_eq!(
            hash_value("pepper", &json!(42)),
            hash_value("pepper", &json!("42"))
        );
    }

    #[test]
    fn hash_and_mask_leave_null_alone() {
        let mut h = redact(json!({"hash": ["id"], "mask": ["card"]}));
        assert_eq!(
            h.run_one(json!({"id": null, "card": null})),
            json!({"id": null, "card": null})
        );
    }

    #[test]
    fn masks_keeping_the_last_four_characters() {
        let mut h = redact(json!({"mask": ["card", "pay.iban"]}));
        assert_eq!(
            h.run_one(
                json!({"card": "4111 1111 1111 1234", "pay": {"iban": "DE89370400440532013000"}})
            ),
            json!({"card": "***1234", "pay": {"iban": "***3000"}})
        );
        assert_eq!(
            h.run_one(json!({"card": "12345"})),
            json!({"card": "***2345"})
        );
        assert_eq!(h.run_one(json!({"card": "1234"})), json!({"card": "***"}));
        assert_eq!(h.run_one(json!({"card": "1"})), json!({"card": "***"}));
        assert_eq!(h.run_one(json!({"card": ""})), json!({"card": "***"}));
        assert_eq!(
            h.run_one(json!({"card": "äöüßéñ"})),
            json!({"card": "***üßéñ"}),
            "characters, not bytes"
        );
        assert_eq!(
            h.run_one(json!({"card": 4_111_111_111_111_234_u64})),
            json!({"card": "***1234"})
        );
        assert_eq!(h.run_one(json!({"card": 12})), json!({"card": "***"}));
        assert_eq!(h.run_one(json!({"card": true})), json!({"card": "***"}));
        assert_eq!(
            h.run_one(json!({"card": {"n": "4111111111111234"}})),
            json!({"card": "***"})
        );
        assert_eq!(
            h.run_one(json!({"card": ["4111111111111234"]})),
            json!({"card": "***"})
        );
    }

    #[test]
    fn all_three_together() {
        let mut h = redact(json!({
            "drop": ["email", "user.ssn"],
            "hash": ["user_id"],
            "salt": "pepper",
            "mask": ["card"],
        }));
        let out = h.run_one(json!({"user_id": "abc", "email": "a@b.c", "card": "4111111111111234", "user": {"ssn": "1", "age": 3}}),
        );
        assert_eq!(
            out,
            json!({
                "user_id": "fadf7b97406e1eaa259a82e26e6839e564c37c256876e060e17838c86b7275ef",
                "card": "***1234",
                "user": {"age": 3},
            })
        );
    }

    #[test]
    fn parent_and_child_in_different_lists() {
        // Masking runs before hashing, hashing before dropping.
        let mut h = redact(json!({"hash": ["user"], "mask": ["user.card"]}));
        let out = h.run_one(json!({"user": {"card": "4111111111111234"}}));
        assert_eq!(
            out,
            json!({"user": hash_value("", &json!({"card": "***1234"}))})
        );

        let mut h = redact(json!({"hash": ["user"], "drop": ["user.card"], "salt": "pepper"}));
        // `user` is a hash (a string) by the time `user.card` would be dropped.
        assert_eq!(
            h.run_one(json!({"user": {"a": 1}})),
            json!({"user": "faa9c19ff81acac836d40c81c85eb498a17a3861f864ac9f6af1eeb65fae451f"})
        );

        let mut h = redact(json!({"drop": ["user"], "hash": ["user.id"]}));
        assert_eq!(
            h.run_one(json!({"user": {"id": 1}, "k": 2})),
            json!({"k": 2})
        );
    }

    #[test]
    fn record_is_otherwise_unchanged() {
        let mut h = redact(json!({"drop": ["x"]}));
        let record = json!({"a": [1, {"b": null}], "c": {"d": "e"}, "f": 1.5});
        assert_eq!(
            h.run(record.clone()).unwrap(),
            vec![Output::new(object(record.clone()))]
        );
        // Nothing to do: the agent keeps its copy.
        assert_eq!(h.answer(record).unwrap(), Answered::Unchanged(None));
        // Without nesting, changes are a patch: no record is rebuilt.
        let mut h = redact(json!({"drop": ["a"], "hash": ["b"], "mask": ["c.d"]}));
        let answered = h
            .answer(json!({"a": 1, "b": 2, "c": {"d": "12345"}, "e": 3}))
            .unwrap();
        assert_eq!(
            answered,
            Answered::Patched(
                3,
                Output::new(object(
                    json!({"b": hash_value("", &json!(2)), "c": {"d": "***2345"}, "e": 3})
                ))
            )
        );
    }

    #[test]
    fn bad_config_fails_init() {
        assert!(init_error(json!({})).contains("nothing to do"));
        assert!(init_error(Value::Null).contains("nothing to do"));
        assert!(init_error(json!({"salt": "x"})).contains("nothing to do"));
        assert!(init_error(json!({"drop": [], "hash": []})).contains("nothing to do"));
        let e = init_error(json!({"drop": ["a"], "hash": ["b", "a"]}));
        assert!(
            e.contains("`a` is listed under both `drop` and `hash`"),
            "{e}"
        );
        let e = init_error(json!({"hash": ["a"], "mask": ["a"]}));
        assert!(e.contains("both `hash` and `mask`"), "{e}");
        for path in ["", "a.", ".a", "a..b"] {
            let e = init_error(json!({"mask": [path]}));
            assert!(e.contains("`mask` entries must be dotted paths"), "{e}");
        }
        let e = init_error(json!({"drop": "email"}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"drop": ["a"], "salt": 5}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"drop": ["a"], "masks": ["b"]}));
        assert!(e.contains("unknown field `masks`"), "{e}");
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = redact(json!({"drop": ["a"]}));
        let e = h.run_json(b"\"text\"").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
        let e = h.run_json(b"").unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        assert_eq!(h.run_one(json!({"a": 1, "b": 2})), json!({"b": 2}));
    }

    #[test]
    fn helpers() {
        assert_eq!(
            hash_value("", &json!("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(mask_text("abcdefgh"), "***efgh");
    }
}
