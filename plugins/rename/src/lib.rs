//! `rename`: renames fields and moves them into or out of nested objects.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "plugins/dist/rename.wasm"
//! [pipelines.transforms.with]
//! fields = { "old" = "new", "user.name" = "user_name", "lat" = "geo.lat" }
//! overwrite = false   # optional, default false
//! ```
//!
//! - `fields` (required, table of source path = target path, at least one): moves
//!   the value at each source to its target. Both are dotted paths into nested objects:
//!   `user.name` is the `name` key of the object under `user`. Intermediate objects of
//!   a target are created when absent (or null); the source's now possibly empty
//!   parent object is left in place.
//! - `overwrite` (optional bool, default false): whether a target that already holds
//!   a value may be replaced. Without it such a record fails with a per-record error.
//!   A target holding `null` counts as absent.
//!
//! All renames of a record happen at once: every source is taken out first, then
//! every target is written, so `{ a = "b", b = "a" }` swaps two fields and
//! `{ a = "b", b = "c" }` shifts them. A renamed field keeps the source's position when
//! source and target are in the same object; otherwise it is added at the end of the
//! target object. A missing source is ignored (its target is left alone).
//!
//! Per-record errors: a target that already exists (without `overwrite`), or a target
//! whose parent path runs through a value that is not an object (`user.name` when
//! `user` is a string). Config errors: no `fields`, a target that is not a string, an
//! empty path or path segment, a source renamed to itself, two sources with the same
//! target, overlapping sources or targets (`a` and `a.b`), an unknown key.

use std::collections::HashMap;

use floe_sdk::path::FieldPath;
use floe_sdk::{Config, Emit, Map, Record, Transform, Value};
use serde::Deserialize;

/// The plugin.
#[derive(Debug)]
pub struct Rename {
    renames: Vec<Move>,
    overwrite: bool,
}

#[derive(Debug)]
struct Move {
    from: FieldPath,
    to: FieldPath,
}

impl Move {
    fn same_parent(&self) -> bool {
        self.from.parent_segments() == self.to.parent_segments()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    fields: Option<Map<String, Value>>,
    #[serde(default)]
    overwrite: bool,
}

fn parse_path(path: &str) -> Result<FieldPath, String> {
    FieldPath::parse(path)
        .map_err(|_| format!("rename: paths must be dotted paths like `user.name`, got {path:?}"))
}

/// Fails if one path of the list is a prefix of another (or equal to it).
fn check_overlaps(paths: &[&FieldPath], what: &str) -> Result<(), String> {
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a.starts_with(b) || b.starts_with(a) {
                return Err(format!("rename: {what} `{a}` and `{b}` overlap"));
            }
        }
    }
    Ok(())
}

/// Writes a value at a dotted path, creating absent (or null) intermediate objects.
fn put(
    record: &mut Map<String, Value>,
    path: &FieldPath,
    value: Value,
    overwrite: bool,
) -> Result<(), String> {
    // A value found here means every parent is an object, so `insert` could not fail.
    if !overwrite && path.get(record).is_some_and(|v| !v.is_null()) {
        return Err(format!(
            "rename: target `{path}` already exists (set `overwrite = true` to replace it)"
        ));
    }
    path.insert(record, value)
        .map_err(|e| format!("rename: {e}"))?;
    Ok(())
}

impl Transform for Rename {
    fn init(config: &Config) -> Result<Self, String> {
        let raw: RawConfig = config.parse()?;
        let fields = raw
            .fields
            .ok_or("rename: `fields` is required, e.g. fields = { old = \"new\" }")?;
        if fields.is_empty() {
            return Err("rename: `fields` is empty".to_string());
        }
        let mut renames = Vec::with_capacity(fields.len());
        let mut targets: HashMap<String, String> = HashMap::new();
        for (from, to) in fields {
            let Value::String(to) = to else {
                return Err(format!(
                    "rename: the target of `{from}` must be a string, got {to}"
                ));
            };
            if from == to {
                return Err(format!("rename: `{from}` is renamed to itself"));
            }
            if let Some(other) = targets.insert(to.clone(), from.clone()) {
                return Err(format!(
                    "rename: `{other}` and `{from}` are both renamed to `{to}`"
                ));
            }
            renames.push(Move {
                from: parse_path(&from)?,
                to: parse_path(&to)?,
            });
        }
        check_overlaps(
            &renames.iter().map(|m| &m.from).collect::<Vec<_>>(),
            "sources",
        )?;
        check_overlaps(
            &renames.iter().map(|m| &m.to).collect::<Vec<_>>(),
            "targets",
        )?;
        Ok(Rename {
            renames,
            overwrite: raw.overwrite,
        })
    }

    fn process(&mut self, record: Record) -> Result<Vec<Emit>, String> {
        let mut value = record.value;

        // Key order of the objects where a field is renamed in place, to restore it;
        // each object is named by the first source in it.
        let mut orders: Vec<(&FieldPath, Vec<String>)> = Vec::new();
        for m in self.renames.iter().filter(|m| m.same_parent()) {
            if orders
                .iter()
                .all(|(p, _)| p.parent_segments() != m.from.parent_segments())
                && let Some(map) = m.from.parent_object_mut(&mut value)
            {
                orders.push((&m.from, map.keys().cloned().collect()));
            }
        }

        let taken: Vec<Option<Value>> = self
            .renames
            .iter()
            .map(|m| m.from.remove(&mut value))
            .collect();
        for (m, v) in self.renames.iter().zip(taken) {
            if let Some(v) = v {
                put(&mut value, &m.to, v, self.overwrite)?;
            }
        }

        for (first, original) in orders {
            let Some(map) = first.parent_object_mut(&mut value) else {
                continue;
            };
            let moved: Vec<(&str, &str)> = self
                .renames
                .iter()
                .filter(|m| m.same_parent() && m.from.parent_segments() == first.parent_segments())
                .map(|m| (m.from.key(), m.to.key()))
                .collect();
            let rank = |key: &str| -> usize {
                let at = |k: &str| original.iter().position(|o| o == k);
                let source = moved
                    .iter()
                    .find(|(_, to)| *to == key)
                    .map(|(from, _)| *from);
                match source.and_then(at) {
                    Some(i) => i,
                    None => at(key).unwrap_or(usize::MAX),
                }
            };
            let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            entries.sort_by_key(|(k, _)| rank(k));
            *map = entries.into_iter().collect();
        }

        Ok(vec![Emit::new(value)])
    }
}

floe_sdk::export_transform!(Rename);

#[cfg(test)]
mod tests {
    use floe_sdk::testing::Harness;
    use floe_sdk::{Value, json};

    use super::*;

    fn rename(config: Value) -> Harness<Rename> {
        Harness::new(config).unwrap()
    }

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    fn init_error(config: Value) -> String {
        Harness::<Rename>::init_error(config)
    }

    #[test]
    fn renames_in_place_keeping_position() {
        let mut h = rename(json!({"fields": {"old": "new"}}));
        let out = h.run_one(json!({"a": 1, "old": {"x": [1]}, "b": 2}));
        assert_eq!(out, json!({"a": 1, "new": {"x": [1]}, "b": 2}));
        assert_eq!(keys(&out), ["a", "new", "b"]);
    }

    #[test]
    fn moves_out_of_and_into_nested_objects() {
        let mut h = rename(
            json!({"fields": {"user.name": "user_name", "lat": "geo.lat", "lon": "geo.lon"}}),
        );
        let out =
            h.run_one(json!({"lat": 1.5, "user": {"name": "ann", "id": 7}, "lon": 2.5, "k": 0}));
        assert_eq!(
            out,
            json!({"user": {"id": 7}, "k": 0, "user_name": "ann", "geo": {"lat": 1.5, "lon": 2.5}})
        );
        assert_eq!(keys(&out), ["user", "k", "user_name", "geo"]);
    }

    #[test]
    fn nested_rename_in_the_same_object_keeps_position() {
        let mut h = rename(json!({"fields": {"user.nm": "user.name"}}));
        let out = h.run_one(json!({"user": {"id": 1, "nm": "ann", "age": 3}}));
        assert_eq!(out, json!({"user": {"id": 1, "name": "ann", "age": 3}}));
        assert_eq!(keys(&out["user"]), ["id", "name", "age"]);
    }

    #[test]
    fn emptied_parent_is_kept() {
        let mut h = rename(json!({"fields": {"user.name": "name"}}));
        assert_eq!(
            h.run_one(json!({"user": {"name": "ann"}})),
            json!({"user": {}, "name": "ann"})
        );
    }

    #[test]
    fn missing_sources_are_ignored() {
        let mut h = rename(json!({"fields": {"a": "b", "x.y": "z", "m.n": "o.p"}}));
        let record = json!({"c": 1, "x": "not an object", "o": 5});
        assert_eq!(h.run_one(record.clone()), record);
        assert_eq!(h.run_one(json!({"a": 1})), json!({"b": 1}));
        // A null source is present and moves like any value.
        assert_eq!(h.run_one(json!({"a": null})), json!({"b": null}));
    }

    #[test]
    fn existing_target_is_a_record_error_without_overwrite() {
        let mut h = rename(json!({"fields": {"old": "new", "user.name": "user.full_name"}}));
        let err = h.run(json!({"old": 1, "new": 2})).unwrap_err();
        assert!(
            err.contains("target `new` already exists") && err.contains("overwrite = true"),
            "{err}"
        );
        let err = h
            .run(json!({"user": {"name": "a", "full_name": "b"}}))
            .unwrap_err();
        assert!(
            err.contains("target `user.full_name` already exists"),
            "{err}"
        );
        // A null target counts as absent; the next record works again.
        assert_eq!(h.run_one(json!({"new": null, "old": 1})), json!({"new": 1}));
        assert_eq!(h.run_one(json!({"old": 1})), json!({"new": 1}));
    }

    #[test]
    fn overwrite_replaces_existing_targets() {
        let mut h = rename(json!({"fields": {"old": "new", "a": "geo.lat"}, "overwrite": true}));
        let out =
            h.run_one(json!({"new": 2, "x": 0, "old": 1, "a": 9, "geo": {"lat": 0, "lon": 1}}));
        assert_eq!(out, json!({"x": 0, "new": 1, "geo": {"lat": 9, "lon": 1}}));
        assert_eq!(
            keys(&out),
            ["x", "new", "geo"],
            "the renamed field takes the source's position"
        );
    }

    #[test]
    fn target_through_a_non_object_is_a_record_error() {
        let mut h = rename(json!({"fields": {"name": "user.name"}}));
        let err = h.run(json!({"name": "ann", "user": "bob"})).unwrap_err();
        assert!(
            err.contains("cannot write `user.name`: `user` is a string, not an object"),
            "{err}"
        );
        let err = h.run(json!({"name": "ann", "user": [1]})).unwrap_err();
        assert!(err.contains("is an array"), "{err}");
        // Null intermediates are replaced by objects, even with overwrite off.
        assert_eq!(
            h.run_one(json!({"name": "ann", "user": null})),
            json!({"user": {"name": "ann"}})
        );
        let mut h = rename(json!({"fields": {"name": "a.b.c"}, "overwrite": true}));
        let err = h.run(json!({"name": 1, "a": {"b": 2}})).unwrap_err();
        assert!(err.contains("`a.b` is a number"), "{err}");
    }

    #[test]
    fn renames_happen_at_once() {
        let mut h = rename(json!({"fields": {"a": "b", "b": "a"}}));
        let out = h.run_one(json!({"a": 1, "b": 2, "c": 3}));
        assert_eq!(out, json!({"b": 1, "a": 2, "c": 3}));
        assert_eq!(keys(&out), ["b", "a", "c"]);
        let mut h = rename(json!({"fields": {"a": "b", "b": "c"}}));
        let out = h.run_one(json!({"a": 1, "b": 2}));
        assert_eq!(out, json!({"b": 1, "c": 2}));
        assert_eq!(keys(&out), ["b", "c"]);
        // Only `a` present: `b` is written, `c` left alone.
        assert_eq!(h.run_one(json!({"a": 1})), json!({"b": 1}));
    }

    #[test]
    fn moves_into_its_own_former_place() {
        let mut h = rename(json!({"fields": {"a": "a.value"}}));
        assert_eq!(h.run_one(json!({"a": 5})), json!({"a": {"value": 5}}));
        let mut h = rename(json!({"fields": {"a.value": "a"}}));
        let err = h.run(json!({"a": {"value": 5, "x": 1}})).unwrap_err();
        assert!(err.contains("target `a` already exists"), "{err}");
        let mut h = rename(json!({"fields": {"a.value": "a"}, "overwrite": true}));
        assert_eq!(
            h.run_one(json!({"a": {"value": 5, "x": 1}})),
            json!({"a": 5})
        );
    }

    #[test]
    fn dotted_keys_are_paths() {
        let mut h = rename(json!({"fields": {"a.b": "c"}}));
        let record = json!({"a.b": 1});
        assert_eq!(h.run_one(record.clone()), record);
    }

    #[test]
    fn bad_config_fails_init() {
        assert!(init_error(json!({})).contains("`fields` is required"));
        assert!(init_error(Value::Null).contains("`fields` is required"));
        assert!(init_error(json!({"fields": {}})).contains("`fields` is empty"));
        let e = init_error(json!({"fields": {"a": 1}}));
        assert!(e.contains("target of `a` must be a string"), "{e}");
        let e = init_error(json!({"fields": {"a": "a"}}));
        assert!(e.contains("renamed to itself"), "{e}");
        let e = init_error(json!({"fields": {"a": "x", "b": "x"}}));
        assert!(e.contains("`a` and `b` are both renamed to `x`"), "{e}");
        for bad in ["", ".a", "a.", "a..b"] {
            assert!(init_error(json!({"fields": {bad: "x"}})).contains("dotted paths"));
            assert!(init_error(json!({"fields": {"x": bad}})).contains("dotted paths"));
        }
        let e = init_error(json!({"fields": {"user": "u", "user.name": "n"}}));
        assert!(e.contains("sources `user` and `user.name` overlap"), "{e}");
        let e = init_error(json!({"fields": {"a": "x", "b": "x.y"}}));
        assert!(e.contains("targets `x` and `x.y` overlap"), "{e}");
        let e = init_error(json!({"fields": {"a": "b"}, "overwrite": "yes"}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"fields": {"a": "b"}, "overwirte": true}));
        assert!(e.contains("unknown field `overwirte`"), "{e}");
        let e = init_error(json!({"fields": ["a", "b"]}));
        assert!(e.contains("invalid plugin config"), "{e}");
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = rename(json!({"fields": {"a": "b"}}));
        assert!(
            h.run_bytes(b"null")
                .unwrap_err()
                .contains("not a JSON object")
        );
        assert_eq!(h.run_one(json!({"a": 1})), json!({"b": 1}));
    }
}
