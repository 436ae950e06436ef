//! `explode`: one record per element of an array field (a flat-map). An order with
//! three items becomes three records, each with the order's other fields and one item.
//!
//! `{"order": 7, "items": [{"sku": "a"}, {"sku": "b"}]}` becomes
//! `{"order": 7, "items": {"sku": "a"}}` and `{"order": 7, "items": {"sku": "b"}}`.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "explode"   # explode.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! field = "items"          # dotted path of the array
//! as = "item"              # optional: where each element goes, default `field` itself
//! index = "item_index"     # optional: where the element's position (from 0) goes
//! keep_empty = false       # optional: an empty array gives one record with a null element
//! ```
//!
//! - `field` (required string): dotted path of the array (`order.items` is the `items`
//!   key of the object under `order`).
//! - `as` (optional string, default `field`): dotted path each element is written to.
//!   By default the element takes the array's place (and position); with another path
//!   the array is removed and the element added there (missing or null parents are
//!   created).
//! - `index` (optional string): dotted path that receives the element's position.
//! - `keep_empty` (optional bool, default false): by default a record whose array is
//!   empty produces nothing; with `keep_empty = true` it produces one record whose
//!   element is `null`.
//!
//! A record whose field is missing or null passes through as it is. Per-record errors:
//! a field that is not an array, an `as` or `index` path through a value that is not an
//! object. Config errors: a missing `field`, an empty path or path segment, `index`
//! equal to `as`, an unknown key.

use std::borrow::Cow;

use floe_sdk::json::{self, Kind};
use floe_sdk::path::FieldPath;
use floe_sdk::{Emit, Error, Record, error, flat_map};
use serde::Deserialize;

/// One record per element of the array.
#[flat_map(Explode)]
fn explode(record: &Record, config: &Config) -> Result<Vec<Emit>, Error> {
    let Some(array) = record.get(&config.field).filter(|v| !v.is_null()) else {
        return Ok(vec![Emit::json(record.json())]);
    };
    if array.kind() != Kind::Array {
        return Err(error!(
            "explode: `{}` is {}, not an array",
            config.field,
            array.kind().described()
        ));
    }
    let base: Cow<'_, [u8]> = if config.target == config.field {
        Cow::Borrowed(record.json())
    } else {
        json::remove(record.json(), &config.field).map_or(Cow::Borrowed(record.json()), Cow::Owned)
    };
    let one = |element: &[u8], i: usize| -> Result<Emit, Error> {
        let mut text =
            json::set(&base, &config.target, element).map_err(|e| error!("explode: {e}"))?;
        if let Some(index) = &config.index {
            text = json::set(&text, index, i.to_string().as_bytes())
                .map_err(|e| error!("explode: {e}"))?;
        }
        Ok(Emit::json(text))
    };
    let mut out = array
        .items()
        .enumerate()
        .map(|(i, item)| one(item.bytes(), i))
        .collect::<Result<Vec<Emit>, Error>>()?;
    if out.is_empty() && config.keep_empty {
        out.push(one(b"null", 0)?);
    }
    Ok(out)
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    field: FieldPath,
    target: FieldPath,
    index: Option<FieldPath>,
    keep_empty: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    field: String,
    #[serde(rename = "as")]
    target: Option<String>,
    index: Option<String>,
    #[serde(default)]
    keep_empty: bool,
}

fn parse_path(path: &str, name: &str) -> Result<FieldPath, String> {
    FieldPath::parse(path).map_err(|_| {
        format!("explode: `{name}` must be a dotted path like `order.items`, got {path:?}")
    })
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
        let field = parse_path(&raw.field, "field")?;
        let target = match &raw.target {
            Some(t) => parse_path(t, "as")?,
            None => field.clone(),
        };
        let index = raw
            .index
            .as_deref()
            .map(|i| parse_path(i, "index"))
            .transpose()?;
        if index.as_ref() == Some(&target) {
            return Err(format!("explode: `index` and `as` are both `{target}`"));
        }
        Ok(Config {
            field,
            target,
            index,
            keep_empty: raw.keep_empty,
        })
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::{Harness, Output, object};
    use floe_sdk::{Value, json};

    use super::*;

    fn explode(config: Value) -> Harness<Explode> {
        Harness::new(config).unwrap()
    }

    fn values(out: Vec<Output>) -> Vec<Value> {
        out.into_iter().map(|o| Value::Object(o.value)).collect()
    }

    #[test]
    fn one_record_per_element_in_place() {
        let mut h = explode(json!({"field": "items"}));
        let out = h
            .run(json!({"order": 7, "items": [{"sku": "a"}, {"sku": "b"}], "z": true}))
            .unwrap();
        assert_eq!(
            values(out),
            [
                json!({"order": 7, "items": {"sku": "a"}, "z": true}),
                json!({"order": 7, "items": {"sku": "b"}, "z": true}),
            ]
        );
        let out = h.run(json!({"items": [1, 2, 3]})).unwrap();
        let keys: Vec<_> = out[0].value.keys().cloned().collect();
        assert_eq!(keys, ["items"]);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn elsewhere_with_an_index() {
        let mut h = explode(json!({"field": "order.items", "as": "item", "index": "meta.i"}));
        let out = h
            .run(json!({"order": {"id": 1, "items": ["a", "b"]}, "meta": null}))
            .unwrap();
        assert_eq!(
            values(out),
            [
                json!({"order": {"id": 1}, "meta": {"i": 0}, "item": "a"}),
                json!({"order": {"id": 1}, "meta": {"i": 1}, "item": "b"}),
            ]
        );
    }

    #[test]
    fn empty_missing_and_wrong_kinds() {
        let mut h = explode(json!({"field": "items"}));
        assert!(h.run(json!({"items": []})).unwrap().is_empty());
        let record = json!({"id": 1});
        assert_eq!(
            h.run(record.clone()).unwrap(),
            vec![Output::new(object(record))]
        );
        assert_eq!(h.run_one(json!({"items": null})), json!({"items": null}));
        let e = h.run(json!({"items": {"a": 1}})).unwrap_err().to_string();
        assert_eq!(e, "explode: `items` is an object, not an array");
        let mut h = explode(json!({"field": "items", "keep_empty": true}));
        assert_eq!(
            h.run_one(json!({"items": [], "k": 1})),
            json!({"items": null, "k": 1})
        );
        let mut h = explode(json!({"field": "items", "as": "k.x"}));
        let e = h
            .run(json!({"items": [1], "k": 5}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`k` is a number, not an object"), "{e}");
    }

    #[test]
    fn bad_config_fails_init() {
        let e = Harness::<Explode>::init_error(json!({}));
        assert!(e.contains("missing field `field`"), "{e}");
        let e = Harness::<Explode>::init_error(json!({"field": "a..b"}));
        assert!(e.contains("dotted path"), "{e}");
        let e = Harness::<Explode>::init_error(json!({"field": "a", "as": "b", "index": "b"}));
        assert!(e.contains("`index` and `as` are both `b`"), "{e}");
        let e = Harness::<Explode>::init_error(json!({"field": "a", "keep": true}));
        assert!(e.contains("unknown field `keep`"), "{e}");
    }
}
