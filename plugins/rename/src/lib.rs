//! `rename`: renames fields and moves them into or out of nested objects.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "rename"   # rename.wasm in the plugin path (docs/plugins.md)
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
//! When every rename stays inside its object (`a` -> `b`, `user.nm` -> `user.name`),
//! the answer is a patch of renames that the agent applies to its own copy (when a
//! target is already there, the plugin rewrites only the objects concerned, copying
//! the other fields' text as it is); a record without any source is answered
//! "unchanged". Moves between objects parse the record.
//!
//! Per-record errors: a target that already exists (without `overwrite`), or a target
//! whose parent path runs through a value that is not an object (`user.name` when
//! `user` is a string). Config errors: no `fields`, a target that is not a string, an
//! empty path or path segment, a source renamed to itself, two sources with the same
//! target, overlapping sources or targets (`a` and `a.b`), an unknown key.

use std::collections::HashMap;

use floe_sdk::json::{Json, Kind, ObjectWriter};
use floe_sdk::path::FieldPath;
use floe_sdk::{Answer, Emit, Error, Map, Patch, Record, Value, error, map};
use serde::Deserialize;

/// Renames and moves the configured fields.
#[map(Rename)]
fn rename(record: &Record, config: &Config) -> Result<Answer, Error> {
    match &config.in_place {
        Some(groups) => config.rename_in_place(record, groups),
        None if !config.renames.iter().any(|m| record.get(&m.from).is_some()) => {
            Ok(Answer::UNCHANGED)
        }
        None => config.rebuild(record),
    }
}

/// What one pass over an object found for one rename.
#[derive(Debug, Clone, Copy, Default)]
struct Found {
    /// The source key is there.
    source: bool,
    /// The target key is there: whether its value is null.
    target: Option<bool>,
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    renames: Vec<Move>,
    overwrite: bool,
    /// When every rename stays in its parent object: the renames grouped by parent.
    in_place: Option<Vec<Group>>,
}

#[derive(Debug)]
struct Move {
    from: FieldPath,
    to: FieldPath,
    /// The last keys of `from` and `to`.
    from_key: String,
    to_key: String,
}

impl Move {
    fn same_parent(&self) -> bool {
        self.from.parent_segments() == self.to.parent_segments()
    }
}

/// Renames inside one object: its path and (index into `renames`) its moves.
#[derive(Debug)]
struct Group {
    parent: Vec<String>,
    moves: Vec<usize>,
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

fn exists_error(path: &FieldPath) -> Error {
    error!("rename: target `{path}` already exists (set `overwrite = true` to replace it)")
}

/// Writes a value at a dotted path, creating absent (or null) intermediate objects.
fn put(
    record: &mut Map<String, Value>,
    path: &FieldPath,
    value: Value,
    overwrite: bool,
) -> Result<(), Error> {
    // A value found here means every parent is an object, so `insert` could not fail.
    if !overwrite && path.get(record).is_some_and(|v| !v.is_null()) {
        return Err(exists_error(path));
    }
    path.insert(record, value)
        .map_err(|e| error!("rename: {e}"))?;
    Ok(())
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
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
            let (from, to) = (parse_path(&from)?, parse_path(&to)?);
            renames.push(Move {
                from_key: from.key().to_string(),
                to_key: to.key().to_string(),
                from,
                to,
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
        let in_place = renames.iter().all(Move::same_parent).then(|| {
            let mut groups: Vec<Group> = Vec::new();
            for (i, m) in renames.iter().enumerate() {
                let parent = m.from.parent_segments();
                match groups.iter_mut().find(|g| g.parent == parent) {
                    Some(g) => g.moves.push(i),
                    None => groups.push(Group {
                        parent: parent.to_vec(),
                        moves: vec![i],
                    }),
                }
            }
            groups
        });
        Ok(Config {
            renames,
            overwrite: raw.overwrite,
            in_place,
        })
    }
}

/// The object a group renames in, if `root` has it.
fn object_of<'a>(group: &Group, root: Json<'a>) -> Option<Json<'a>> {
    if group.parent.is_empty() {
        Some(root)
    } else {
        root.get(group.parent.as_slice())
            .filter(|o| o.kind() == Kind::Object)
    }
}

impl Config {
    /// Renames inside objects by rewriting only those objects' text: one pass over each
    /// object to see what is there, one over what it found to write it.
    fn rename_in_place(&self, record: &Record, groups: &[Group]) -> Result<Answer, Error> {
        let root = record.value();
        // On the stack for the usual few renames (allocating costs a WebAssembly guest).
        let mut few = [Found::default(); 8];
        let mut many = Vec::new();
        let found: &mut [Found] = match few.get_mut(..self.renames.len()) {
            Some(f) => f,
            None => {
                many.resize(self.renames.len(), Found::default());
                &mut many
            }
        };
        for group in groups {
            // The record's own fields come from the agent's field index, unscanned.
            let fields = match group.parent.is_empty() {
                true => record.fields(),
                false => match object_of(group, root) {
                    Some(object) => object.fields(),
                    None => continue,
                },
            };
            for (key, value) in fields {
                for &i in &group.moves {
                    let m = &self.renames[i];
                    if key.is(&m.from_key) {
                        found[i].source = true;
                    } else if key.is(&m.to_key) {
                        found[i].target = Some(value.is_null());
                    }
                }
            }
        }
        if !found.iter().any(|f| f.source) {
            return Ok(Answer::UNCHANGED);
        }
        // Targets in the way, in config order.
        for (i, m) in self.renames.iter().enumerate() {
            if !found[i].source || found[i].target != Some(false) || self.overwrite {
                continue;
            }
            let group = groups
                .iter()
                .find(|g| g.moves.contains(&i))
                .expect("grouped");
            let target_moves_away = group
                .moves
                .iter()
                .any(|&j| found[j].source && self.renames[j].from_key == m.to_key);
            if !target_moves_away {
                return Err(exists_error(&m.to));
            }
        }
        // No target in the way: the agent renames the keys in its own copy.
        if found.iter().all(|f| !f.source || f.target.is_none()) {
            let patch = self
                .renames
                .iter()
                .zip(found.iter())
                .filter(|(_, f)| f.source)
                .fold(Patch::new(), |p, (m, _)| p.rename(&m.from, &m.to_key));
            return Ok(patch.into());
        }
        // A target is in the way and moves too: rewrite the objects concerned (rare).
        let mut text: Option<Vec<u8>> = None;
        for group in groups {
            let moves: Vec<&Move> = group
                .moves
                .iter()
                .filter(|&&j| found[j].source)
                .map(|&j| &self.renames[j])
                .collect();
            if moves.is_empty() {
                continue;
            }
            let new_text = {
                let current = text.as_deref().unwrap_or(record.json());
                let mut out = ObjectWriter::with_capacity(current.len() + 16);
                let fields = object_of(group, Json::new(current)).map(|o| o.fields());
                for (key, value) in fields.into_iter().flatten() {
                    if let Some(m) = moves.iter().find(|m| key.is(&m.from_key)) {
                        out.raw(&m.to_key, value);
                    } else if !moves.iter().any(|m| key.is(&m.to_key)) {
                        out.raw_member(key, value);
                    }
                }
                let rewritten = out.finish();
                if group.parent.is_empty() {
                    rewritten
                } else {
                    floe_sdk::json::set(current, group.parent.as_slice(), &rewritten)?
                }
            };
            text = Some(new_text);
        }
        Ok(match text {
            Some(text) => Emit::json(text).into(),
            None => Answer::UNCHANGED,
        })
    }

    /// Renames on the whole parsed record (moves between objects).
    fn rebuild(&self, record: &Record) -> Result<Answer, Error> {
        let mut value = record.to_map()?;

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

        Ok(Emit::new(value).into())
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::Harness;
    use floe_sdk::{Value, json};

    use super::*;

    fn rename(config: Value) -> Harness<Rename> {
        Harness::new(config).unwrap()
    }

    /// The same renames forced through the whole-record path.
    fn rebuilt(config: Value) -> Harness<Rename> {
        let mut h = rename(config);
        h.plugin().0.in_place = None;
        h
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
    fn more_renames_than_fit_on_the_stack() {
        let fields: Map<String, Value> = (0..12)
            .map(|i| (format!("f{i}"), json!(format!("g{i}"))))
            .collect();
        let mut h = rename(json!({ "fields": fields }));
        let record: Map<String, Value> = (0..12).map(|i| (format!("f{i}"), json!(i))).collect();
        let out = h.run_one(Value::Object(record));
        let want: Vec<String> = (0..12).map(|i| format!("g{i}")).collect();
        assert_eq!(keys(&out), want);
        assert_eq!(out["g11"], 11);
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
            err.to_string().contains("target `new` already exists")
                && err.to_string().contains("overwrite = true"),
            "{err}"
        );
        let err = h
            .run(json!({"user": {"name": "a", "full_name": "b"}}))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("target `user.full_name` already exists"),
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
            err.to_string()
                .contains("cannot write `user.name`: `user` is a string, not an object"),
            "{err}"
        );
        let err = h.run(json!({"name": "ann", "user": [1]})).unwrap_err();
        assert!(err.to_string().contains("is an array"), "{err}");
        // Null intermediates are replaced by objects, even with overwrite off.
        assert_eq!(
            h.run_one(json!({"name": "ann", "user": null})),
            json!({"user": {"name": "ann"}})
        );
        let mut h = rename(json!({"fields": {"name": "a.b.c"}, "overwrite": true}));
        let err = h.run(json!({"name": 1, "a": {"b": 2}})).unwrap_err();
        assert!(err.to_string().contains("`a.b` is a number"), "{err}");
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
        assert!(
            err.to_string().contains("target `a` already exists"),
            "{err}"
        );
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
    fn in_place_and_whole_record_paths_agree() {
        let configs = [
            json!({"fields": {"a": "b"}}),
            json!({"fields": {"a": "b"}, "overwrite": true}),
            json!({"fields": {"a": "b", "b": "a"}}),
            json!({"fields": {"a": "b", "b": "c"}}),
            json!({"fields": {"c": "a", "d": "b"}, "overwrite": true}),
            json!({"fields": {"a": "b", "u.x": "u.y"}}),
            json!({"fields": {"u.x": "u.y", "u.y": "u.x", "d": "e"}, "overwrite": true}),
        ];
        let mut compared = 0;
        for bits in 0..(1u32 << 7) {
            for null in [false, true] {
                let mut record = floe_sdk::Map::new();
                for (i, key) in ["d", "a", "c", "b"].iter().enumerate() {
                    if bits & (1 << i) != 0 {
                        let v = if null && i == 3 {
                            Value::Null
                        } else {
                            json!(i)
                        };
                        record.insert(key.to_string(), v);
                    }
                }
                if bits & (1 << 4) != 0 {
                    let mut u = floe_sdk::Map::new();
                    if bits & (1 << 5) != 0 {
                        u.insert("y".into(), json!("y"));
                    }
                    if bits & (1 << 6) != 0 {
                        u.insert("x".into(), json!("x"));
                    }
                    u.insert("z".into(), json!(0));
                    record.insert("u".into(), Value::Object(u));
                }
                let record = Value::Object(record);
                for config in &configs {
                    let fast = rename(config.clone()).run(record.clone());
                    let slow = rebuilt(config.clone()).run(record.clone());
                    let show = |r: Result<Vec<floe_sdk::testing::Output>, floe_sdk::Error>| match r
                    {
                        Ok(out) => format!(
                            "{:?}",
                            out.iter()
                                .map(|o| floe_sdk::serde_json::to_string(&o.value).unwrap())
                                .collect::<Vec<_>>()
                        ),
                        Err(e) => format!("error {e}"),
                    };
                    assert_eq!(show(fast), show(slow), "{config} on {record}");
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 128 * 2 * configs.len());
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = rename(json!({"fields": {"a": "b"}}));
        let e = h.run_json(b"null").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
        assert_eq!(h.run_one(json!({"a": 1})), json!({"b": 1}));
    }
}
