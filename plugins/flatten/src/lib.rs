//! `flatten`: turns nested objects into top-level fields whose names join the path.
//!
//! `{"a": {"b": 1, "c": {"d": 2}}, "e": [{"f": 3}]}` becomes
//! `{"a_b": 1, "a_c_d": 2, "e": [{"f": 3}]}`.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "flatten"   # flatten.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! separator = "_"   # optional, default "_"
//! max_depth = 2     # optional, default unlimited
//! ```
//!
//! - `separator` (optional string, default `"_"`): put between the keys of a path.
//!   It may be empty (`{"a": {"b": 1}}` -> `{"ab": 1}`).
//! - `max_depth` (optional integer >= 1, default unlimited): how many levels of
//!   nesting are flattened. With `max_depth = 1`, `{"a": {"b": {"c": 1}}}` becomes
//!   `{"a_b": {"c": 1}}`: objects deeper than that are kept as values.
//!
//! Arrays are left as they are, objects inside them included. An empty object is
//! kept as an empty object under its flattened name (`{"a": {"b": {}}}` ->
//! `{"a_b": {}}`), so the field is not lost. Fields keep their order, nested fields
//! taking the place of their parent.
//!
//! A record without a nested object is answered "unchanged"; otherwise the new
//! record is written from the text of the old one, values copied as they are.
//!
//! Per-record error: two fields that flatten to the same name, e.g. an existing
//! `a_b` next to `{"a": {"b": ...}}`. Config errors: `max_depth = 0`, wrong types,
//! an unknown key.

use std::collections::HashMap;

use floe_sdk::json::{Json, Kind, ObjectWriter};
use floe_sdk::{Answer, Emit, Error, Record, error, map};
use serde::Deserialize;

/// Flattens nested objects.
#[map(Flatten)]
fn flatten(record: &Record, config: &Config) -> Result<Answer, Error> {
    if !record.fields().any(|(_, v)| nested(v)) {
        return Ok(Answer::UNCHANGED);
    }
    let mut out = Out {
        fields: ObjectWriter::with_capacity(record.json().len() + 32),
        origins: HashMap::new(),
    };
    for (key, value) in record.fields() {
        let key = key
            .as_str()
            .ok_or_else(|| error!("flatten: a key is not valid JSON text"))?;
        config.add(
            &mut out,
            key.to_string(),
            key.to_string(),
            value,
            config.max_depth,
        )?;
    }
    Ok(Emit::json(out.fields.finish()).into())
}

/// A non-empty object: what is flattened.
fn nested(value: Json<'_>) -> bool {
    value.kind() == Kind::Object && value.fields().next().is_some()
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    separator: String,
    max_depth: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    separator: Option<String>,
    max_depth: Option<usize>,
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
        if raw.max_depth == Some(0) {
            return Err(
                "flatten: `max_depth` must be at least 1 (leave it out for unlimited)".to_string(),
            );
        }
        Ok(Config {
            separator: raw.separator.unwrap_or_else(|| "_".to_string()),
            max_depth: raw.max_depth,
        })
    }
}

/// Output being built: the flattened fields and, for error messages, where each came from.
struct Out {
    fields: ObjectWriter,
    origins: HashMap<String, String>,
}

impl Config {
    fn add(
        &self,
        out: &mut Out,
        name: String,
        origin: String,
        value: Json<'_>,
        levels_left: Option<usize>,
    ) -> Result<(), Error> {
        if nested(value) && levels_left != Some(0) {
            for (key, v) in value.fields() {
                let key = key
                    .as_str()
                    .ok_or_else(|| error!("flatten: a key is not valid JSON text"))?;
                let child_name = format!("{name}{}{key}", self.separator);
                let child_origin = format!("{origin}.{key}");
                self.add(out, child_name, child_origin, v, levels_left.map(|n| n - 1))?;
            }
            return Ok(());
        }
        if let Some(first) = out.origins.get(&name) {
            return Err(error!(
                "flatten: `{first}` and `{origin}` both flatten to `{name}`"
            ));
        }
        out.fields.raw(&name, value);
        out.origins.insert(name, origin);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::Harness;
    use floe_sdk::{Value, json};

    use super::*;

    fn flatten(config: Value) -> Harness<Flatten> {
        Harness::new(config).unwrap()
    }

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    fn init_error(config: Value) -> String {
        Harness::<Flatten>::init_error(config)
    }

    #[test]
    fn flattens_nested_objects_with_the_default_separator() {
        let mut h = flatten(json!({}));
        assert_eq!(
            h.run_one(json!({"a": {"b": 1, "c": {"d": 2}}})),
            json!({"a_b": 1, "a_c_d": 2})
        );
        let mut h = flatten(Value::Null);
        assert_eq!(h.run_one(json!({"a": {"b": null}})), json!({"a_b": null}));
    }

    #[test]
    fn keeps_order_with_nested_fields_in_place_of_their_parent() {
        let mut h = flatten(json!({}));
        let out = h.run_one(json!({"z": 0, "a": {"y": 1, "b": {"x": 2}}, "m": 3}));
        assert_eq!(keys(&out), ["z", "a_y", "a_b_x", "m"]);
    }

    #[test]
    fn arrays_are_left_alone() {
        let mut h = flatten(json!({}));
        let record = json!({"e": [{"f": {"g": 3}}, 1], "h": {"i": [{"j": {"k": 1}}]}});
        assert_eq!(
            h.run_one(record),
            json!({"e": [{"f": {"g": 3}}, 1], "h_i": [{"j": {"k": 1}}]})
        );
    }

    #[test]
    fn flat_records_are_unchanged() {
        let mut h = flatten(json!({}));
        let record = json!({"a": 1, "b": "x", "c": null, "d": [1], "e": true, "f": 1.5});
        assert_eq!(h.run_one(record.clone()), record);
        assert_eq!(h.run_one(json!({})), json!({}));
    }

    #[test]
    fn empty_objects_are_kept() {
        let mut h = flatten(json!({}));
        assert_eq!(
            h.run_one(json!({"a": {}, "b": {"c": {}, "d": 1}})),
            json!({"a": {}, "b_c": {}, "b_d": 1})
        );
    }

    #[test]
    fn custom_separator() {
        let mut h = flatten(json!({"separator": "."}));
        assert_eq!(
            h.run_one(json!({"a": {"b": {"c": 1}}})),
            json!({"a.b.c": 1})
        );
        let mut h = flatten(json!({"separator": "__"}));
        assert_eq!(h.run_one(json!({"a": {"b": 1}})), json!({"a__b": 1}));
        let mut h = flatten(json!({"separator": ""}));
        assert_eq!(h.run_one(json!({"a": {"b": 1}})), json!({"ab": 1}));
    }

    #[test]
    fn max_depth_limits_levels() {
        let record = json!({"a": {"b": {"c": {"d": 1}}, "e": 2}, "f": 3});
        let mut h = flatten(json!({"max_depth": 1}));
        assert_eq!(
            h.run_one(record.clone()),
            json!({"a_b": {"c": {"d": 1}}, "a_e": 2, "f": 3})
        );
        let mut h = flatten(json!({"max_depth": 2}));
        assert_eq!(
            h.run_one(record.clone()),
            json!({"a_b_c": {"d": 1}, "a_e": 2, "f": 3})
        );
        let mut h = flatten(json!({"max_depth": 3}));
        assert_eq!(
            h.run_one(record.clone()),
            json!({"a_b_c_d": 1, "a_e": 2, "f": 3})
        );
        let mut h = flatten(json!({"max_depth": 100}));
        assert_eq!(h.run_one(record), json!({"a_b_c_d": 1, "a_e": 2, "f": 3}));
    }

    #[test]
    fn deep_nesting() {
        let mut record = json!(1);
        for _ in 0..50 {
            record = json!({"n": record});
        }
        let mut h = flatten(json!({}));
        let out = h.run_one(record);
        assert_eq!(out, json!({ vec!["n"; 50].join("_"): 1 }));
    }

    #[test]
    fn collisions_are_record_errors() {
        let mut h = flatten(json!({}));
        let err = h.run(json!({"a_b": 1, "a": {"b": 2}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "flatten: `a_b` and `a.b` both flatten to `a_b`"
        );
        let err = h.run(json!({"a": {"b": 2}, "a_b": 1})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "flatten: `a.b` and `a_b` both flatten to `a_b`"
        );
        let err = h
            .run(json!({"a": {"b_c": 1}, "a_b": {"c": 2}}))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "flatten: `a.b_c` and `a_b.c` both flatten to `a_b_c`"
        );
        // The next record is fine.
        assert_eq!(h.run_one(json!({"a": {"b": 2}})), json!({"a_b": 2}));
        // A collision with a field that is not flattened (beyond max_depth) counts too.
        let mut h = flatten(json!({"max_depth": 1}));
        let err = h.run(json!({"a": {"b": {"c": 1}}, "a_b": 0})).unwrap_err();
        assert!(err.to_string().contains("both flatten to `a_b`"), "{err}");
    }

    #[test]
    fn bad_config_fails_init() {
        let e = init_error(json!({"max_depth": 0}));
        assert!(e.contains("at least 1"), "{e}");
        let e = init_error(json!({"max_depth": -1}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"max_depth": "2"}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"separator": 1}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"sep": "."}));
        assert!(e.contains("unknown field `sep`"), "{e}");
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = flatten(json!({}));
        let e = h.run_json(b"42").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
