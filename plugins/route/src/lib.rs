//! `route`: sends each record to an output stream chosen by the value of one field.
//! Each stream is written to its own table.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "route"   # route.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! field = "geo.region"                                  # dotted path
//! routes = { eu = "events_eu", us = "events_us", 7 = "events_seven" }
//! default = "events_other"                              # optional
//! drop_field = true                                     # optional, default false
//! ```
//!
//! - `field` (required string): dotted path of the routing field (`geo.region` is the
//!   `region` key of the object under `geo`).
//! - `routes` (required table of value = stream name): the field's value as text
//!   (a string as itself, a number as its JSON text such as `7` or `1.5`, a boolean
//!   as `true`/`false`) selects the output stream. Matching is exact and
//!   case-sensitive; `1.0` and `1` are different texts.
//! - `default` (optional string): the stream of records whose value is not in
//!   `routes`, is null, an array or an object, or is missing. Without `default`
//!   such records keep the input's stream.
//! - `drop_field` (optional bool, default false): removes the routing field from
//!   every output record (routed or not).
//!
//! There are no per-record errors. Config errors: no `field`, an empty path or path
//! segment, a stream name that is not a non-empty string, empty `routes` without a
//! `default`, an unknown key.

use std::collections::HashMap;

use floe_sdk::json::{Json, Kind};
use floe_sdk::path::FieldPath;
use floe_sdk::{Answer, Patch, Record, Value, map};
use serde::Deserialize;

/// Routes each record by the value of one field.
#[map(Route)]
fn route(record: &Record, config: &Config) -> Answer {
    let found = record.get(&config.path);
    let stream = found
        .and_then(as_text)
        .and_then(|text| config.routes.get(&text))
        .or(config.default.as_ref())
        .cloned();
    if config.drop_field && found.is_some() {
        let patch = Patch::new().remove(&config.path);
        return match stream {
            Some(stream) => patch.route(stream).into(),
            None => patch.into(),
        };
    }
    Answer::Unchanged { route: stream }
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    path: FieldPath,
    routes: HashMap<String, String>,
    default: Option<String>,
    drop_field: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    field: String,
    routes: HashMap<String, String>,
    default: Option<String>,
    #[serde(default)]
    drop_field: bool,
}

/// The routing text of a value: strings, numbers (as `serde_json` writes them) and
/// booleans only.
fn as_text(value: Json<'_>) -> Option<String> {
    match value.kind() {
        Kind::String => value.as_str().map(|s| s.into_owned()),
        Kind::Number => match value.to_value().ok()? {
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        },
        Kind::Bool => value.as_bool().map(|b| b.to_string()),
        _ => None,
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
        let path = FieldPath::parse(&raw.field).map_err(|_| {
            format!(
                "route: `field` must be a dotted path like `geo.region`, got {:?}",
                raw.field
            )
        })?;
        if let Some((value, _)) = raw.routes.iter().find(|(_, stream)| stream.is_empty()) {
            return Err(format!("route: the stream name for `{value}` is empty"));
        }
        if raw.default.as_deref() == Some("") {
            return Err("route: `default` is an empty stream name".to_string());
        }
        if raw.routes.is_empty() && raw.default.is_none() {
            return Err(
                "route: `routes` is empty and there is no `default`, so nothing would be routed"
                    .to_string(),
            );
        }
        Ok(Config {
            path,
            routes: raw.routes,
            default: raw.default,
            drop_field: raw.drop_field,
        })
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::{Harness, Output, object};
    use floe_sdk::{Value, json};

    use super::*;

    fn route(config: Value) -> Harness<Route> {
        Harness::new(config).unwrap()
    }

    /// Runs one record; returns its route and value.
    fn run(h: &mut Harness<Route>, record: Value) -> (Option<String>, Value) {
        let mut out = h.run(record).unwrap();
        assert_eq!(out.len(), 1);
        let emit = out.remove(0);
        (emit.route, Value::Object(emit.value))
    }

    fn stream(h: &mut Harness<Route>, record: Value) -> Option<String> {
        run(h, record).0
    }

    fn init_error(config: Value) -> String {
        Harness::<Route>::init_error(config)
    }

    fn s(name: &str) -> Option<String> {
        Some(name.to_string())
    }

    #[test]
    fn routes_by_string_value() {
        let mut h =
            route(json!({"field": "region", "routes": {"eu": "events_eu", "us": "events_us"}}));
        let record = json!({"region": "eu", "x": 1});
        assert_eq!(
            h.run(record.clone()).unwrap(),
            vec![Output::to("events_eu", object(record))]
        );
        assert_eq!(stream(&mut h, json!({"region": "us"})), s("events_us"));
        assert_eq!(
            stream(&mut h, json!({"region": "EU"})),
            None,
            "case-sensitive"
        );
        assert_eq!(
            stream(&mut h, json!({"region": "apac"})),
            None,
            "unmapped keeps the input's stream"
        );
        assert_eq!(
            stream(&mut h, json!({})),
            None,
            "missing keeps the input's stream"
        );
        assert_eq!(stream(&mut h, json!({"region": null})), None);
    }

    #[test]
    fn routes_by_number_and_bool_as_text() {
        let mut h = route(
            json!({"field": "k", "routes": {"7": "seven", "1.5": "one_and_a_half", "-1": "minus", "true": "yes"}}),
        );
        assert_eq!(stream(&mut h, json!({"k": 7})), s("seven"));
        assert_eq!(stream(&mut h, json!({"k": "7"})), s("seven"));
        assert_eq!(stream(&mut h, json!({"k": 1.5})), s("one_and_a_half"));
        assert_eq!(stream(&mut h, json!({"k": -1})), s("minus"));
        assert_eq!(
            stream(&mut h, json!({"k": 7.0})),
            None,
            "7.0 is not the text 7"
        );
        assert_eq!(stream(&mut h, json!({"k": true})), s("yes"));
        assert_eq!(stream(&mut h, json!({"k": false})), None);
        assert_eq!(stream(&mut h, json!({"k": [7]})), None);
        assert_eq!(stream(&mut h, json!({"k": {"7": 7}})), None);
    }

    #[test]
    fn default_catches_unmapped_and_missing() {
        let mut h =
            route(json!({"field": "region", "routes": {"eu": "events_eu"}, "default": "other"}));
        assert_eq!(stream(&mut h, json!({"region": "eu"})), s("events_eu"));
        assert_eq!(stream(&mut h, json!({"region": "us"})), s("other"));
        assert_eq!(stream(&mut h, json!({"region": null})), s("other"));
        assert_eq!(stream(&mut h, json!({"region": ["eu"]})), s("other"));
        assert_eq!(stream(&mut h, json!({})), s("other"));
        // Only a default: everything goes there.
        let mut h = route(json!({"field": "region", "routes": {}, "default": "all"}));
        assert_eq!(stream(&mut h, json!({"region": "eu"})), s("all"));
    }

    #[test]
    fn nested_field() {
        let mut h = route(
            json!({"field": "geo.region", "routes": {"eu": "events_eu"}, "default": "other"}),
        );
        assert_eq!(
            stream(&mut h, json!({"geo": {"region": "eu"}})),
            s("events_eu")
        );
        assert_eq!(stream(&mut h, json!({"geo": "eu"})), s("other"));
        assert_eq!(
            stream(&mut h, json!({"geo.region": "eu"})),
            s("other"),
            "dots always mean nesting"
        );
    }

    #[test]
    fn drop_field_removes_the_routing_field_everywhere() {
        let mut h =
            route(json!({"field": "region", "routes": {"eu": "events_eu"}, "drop_field": true}));
        assert_eq!(
            run(&mut h, json!({"a": 1, "region": "eu", "b": 2})),
            (s("events_eu"), json!({"a": 1, "b": 2}))
        );
        assert_eq!(
            run(&mut h, json!({"a": 1, "region": "us"})),
            (None, json!({"a": 1}))
        );
        assert_eq!(run(&mut h, json!({"a": 1})), (None, json!({"a": 1})));
        let (_, v) = run(&mut h, json!({"b": 1, "region": "eu", "a": 2}));
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["b", "a"],
            "order kept"
        );

        let mut h = route(
            json!({"field": "geo.region", "routes": {"eu": "x"}, "default": "y", "drop_field": true}),
        );
        assert_eq!(
            run(&mut h, json!({"geo": {"region": "eu", "city": "c"}})),
            (s("x"), json!({"geo": {"city": "c"}}))
        );
        assert_eq!(
            run(&mut h, json!({"geo": {"region": "us"}})),
            (s("y"), json!({"geo": {}}))
        );
    }

    #[test]
    fn without_drop_field_the_record_is_unchanged() {
        let mut h =
            route(json!({"field": "region", "routes": {"eu": "events_eu"}, "drop_field": false}));
        let record = json!({"region": "eu", "n": {"x": [1, 2]}});
        assert_eq!(run(&mut h, record.clone()), (s("events_eu"), record));
    }

    #[test]
    fn bad_config_fails_init() {
        let e = init_error(json!({"routes": {"eu": "x"}}));
        assert!(e.contains("missing field `field`"), "{e}");
        let e = init_error(json!({"field": "region"}));
        assert!(e.contains("missing field `routes`"), "{e}");
        let e = init_error(Value::Null);
        assert!(e.contains("missing field"), "{e}");
        let e = init_error(json!({"field": "region", "routes": {}}));
        assert!(e.contains("nothing would be routed"), "{e}");
        let e = init_error(json!({"field": "region", "routes": {"eu": ""}}));
        assert!(e.contains("stream name for `eu` is empty"), "{e}");
        let e = init_error(json!({"field": "region", "routes": {"eu": "x"}, "default": ""}));
        assert!(e.contains("`default` is an empty stream name"), "{e}");
        let e = init_error(json!({"field": "region", "routes": {"eu": 1}}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"field": 3, "routes": {"eu": "x"}}));
        assert!(e.contains("invalid plugin config"), "{e}");
        for bad in ["", "a.", ".a", "a..b"] {
            let e = init_error(json!({"field": bad, "routes": {"eu": "x"}}));
            assert!(e.contains("dotted path"), "{e}");
        }
        let e = init_error(json!({"field": "region", "routes": {"eu": "x"}, "drop": true}));
        assert!(e.contains("unknown field `drop`"), "{e}");
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = route(json!({"field": "region", "routes": {"eu": "x"}}));
        let e = h.run_json(b"[]").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
