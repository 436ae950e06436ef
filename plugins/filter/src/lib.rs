//! `filter`: keeps the records that match conditions on their fields and drops the
//! others (a dropped record emits nothing).
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "filter"   # filter.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! # Every condition of `all` must hold...
//! all = [
//!   { field = "status", op = "eq", value = "paid" },
//!   { field = "amount", op = "gte", value = 10 },
//!   { field = "user.id", op = "exists" },
//! ]
//! # ...and at least one of `any`.
//! any = [
//!   { field = "user.country", op = "in", value = ["DE", "FR"] },
//!   { field = "tags", op = "contains", value = "vip" },
//! ]
//! ```
//!
//! - `all` (optional): list of conditions that must all hold.
//! - `any` (optional): list of conditions of which at least one must hold.
//!
//! At least one condition must be given; when both lists are given, a record is kept
//! if all of `all` hold AND at least one of `any` holds. An `any` that is given must not
//! be empty.
//!
//! A condition is `{ field, op, value }`:
//!
//! - `field`: a dotted path into nested objects (`user.country` is the `country` key
//!   of the object under `user`). A path through something that is not an object
//!   finds nothing.
//! - `op`, and what `value` must be:
//!   - `eq`, `ne`: any value. Numbers compare numerically (`1` equals `1.0`), other
//!     values must be of the same kind and equal (deep for arrays and objects).
//!   - `gt`, `gte`, `lt`, `lte`: a number or a string. Numbers compare numerically,
//!     strings lexically (by Unicode code point, so RFC 3339 timestamps in the same
//!     zone compare chronologically).
//!   - `in`: a list; holds if the field equals (as `eq`) one of its elements.
//!   - `exists`, `missing`: no `value`. `exists` holds if the field is present and
//!     not null; `missing` holds if it is absent or null.
//!   - `contains`: holds if the field is a string containing `value` (a string) as a
//!     substring, or an array with an element equal (as `eq`) to `value`.
//!   - `prefix`: a string; holds if the field is a string starting with it.
//!
//! All ops except `missing` are false when the field is absent, and all comparisons
//! are false when the field and `value` are of different kinds (`ne` included: `ne`
//! holds only for a present field of the same kind with a different value; a JSON
//! null is its own kind). An unknown op, a missing or wrongly typed `value`, an empty
//! `field` or an unknown key fail `init`.

use std::cmp::Ordering;

use floe_sdk::json::Kind;
use floe_sdk::path::FieldPath;
use floe_sdk::serde_json::Number;
use floe_sdk::{Record, Value, filter};
use serde::{Deserialize, Deserializer};

/// Keeps the records that match the conditions.
#[filter(Filter)]
fn filter(record: &Record, conditions: &Conditions) -> bool {
    conditions.matches(record)
}

/// The parsed config: the conditions.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Conditions {
    all: Vec<Condition>,
    any: Vec<Condition>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    all: Option<Vec<RawCondition>>,
    any: Option<Vec<RawCondition>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    field: String,
    op: String,
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
}

/// Keeps an explicit `null` as `Some(Value::Null)`, apart from an absent key.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// One parsed condition.
#[derive(Debug)]
struct Condition {
    path: FieldPath,
    test: Test,
}

#[derive(Debug)]
enum Test {
    Eq(Value),
    Ne(Value),
    Order(Ordered, Value),
    In(Vec<Value>),
    Exists,
    Missing,
    Contains(Value),
    Prefix(String),
}

#[derive(Debug, Clone, Copy)]
enum Ordered {
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Ordered {
    /// Whether a value that compares `ord` to the wanted one passes.
    fn holds(self, ord: Ordering) -> bool {
        match self {
            Ordered::Gt => ord == Ordering::Greater,
            Ordered::Gte => ord != Ordering::Less,
            Ordered::Lt => ord == Ordering::Less,
            Ordered::Lte => ord != Ordering::Greater,
        }
    }
}

const OPS: &str = "eq, ne, gt, gte, lt, lte, in, exists, missing, contains, prefix";

impl Condition {
    fn parse(raw: RawCondition, at: &str) -> Result<Condition, String> {
        let path = parse_path(&raw.field).map_err(|e| format!("{at}: {e}"))?;
        let op = raw.op.as_str();
        let need =
            |value: Option<Value>| value.ok_or_else(|| format!("{at}: op `{op}` needs a `value`"));
        let test = match op {
            "eq" => Test::Eq(need(raw.value)?),
            "ne" => Test::Ne(need(raw.value)?),
            "gt" | "gte" | "lt" | "lte" => {
                let value = need(raw.value)?;
                if !(value.is_number() || value.is_string()) {
                    return Err(format!(
                        "{at}: op `{op}` needs a number or a string as `value`, got {value}"
                    ));
                }
                let ordered = match op {
                    "gt" => Ordered::Gt,
                    "gte" => Ordered::Gte,
                    "lt" => Ordered::Lt,
                    _ => Ordered::Lte,
                };
                Test::Order(ordered, value)
            }
            "in" => match need(raw.value)? {
                Value::Array(list) => Test::In(list),
                other => {
                    return Err(format!(
                        "{at}: op `in` needs a list as `value`, got {other}"
                    ));
                }
            },
            "exists" | "missing" => {
                if raw.value.is_some() {
                    return Err(format!("{at}: op `{op}` takes no `value`"));
                }
                if op == "exists" {
                    Test::Exists
                } else {
                    Test::Missing
                }
            }
            "contains" => Test::Contains(need(raw.value)?),
            "prefix" => match need(raw.value)? {
                Value::String(s) => Test::Prefix(s),
                other => {
                    return Err(format!(
                        "{at}: op `prefix` needs a string as `value`, got {other}"
                    ));
                }
            },
            other => {
                return Err(format!(
                    "{at}: unknown op `{other}` (expected one of {OPS})"
                ));
            }
        };
        Ok(Condition { path, test })
    }

    fn holds(&self, record: &Record) -> bool {
        // Only the field is read, and only its value is parsed.
        let found = record.get(&self.path);
        match &self.test {
            Test::Exists => found.is_some_and(|v| !v.is_null()),
            Test::Missing => found.is_none_or(|v| v.is_null()),
            _ => match found {
                None => false,
                // A string (what filters test most) is compared as it is: no value
                // built, and for equality not even unescaped.
                Some(v) if v.kind() == Kind::String => {
                    let is = |want: &Value| want.as_str().is_some_and(|w| v.is_str(w));
                    match &self.test {
                        Test::Eq(want) => is(want),
                        Test::In(list) => list.iter().any(is),
                        _ => v.as_str().is_some_and(|s| self.test_str(&s)),
                    }
                }
                Some(v) => v.to_value().is_ok_and(|v| self.test_value(&v)),
            },
        }
    }

    /// [`Condition::test_value`] for a string value.
    fn test_str(&self, s: &str) -> bool {
        let is = |want: &Value| want.as_str() == Some(s);
        match &self.test {
            Test::Eq(want) => is(want),
            Test::Ne(want) => want.is_string() && !is(want),
            Test::Order(op, want) => want.as_str().is_some_and(|w| op.holds(s.cmp(w))),
            Test::In(list) => list.iter().any(is),
            Test::Contains(want) => want.as_str().is_some_and(|sub| s.contains(sub)),
            Test::Prefix(prefix) => s.starts_with(prefix.as_str()),
            Test::Exists | Test::Missing => unreachable!("handled in `holds`"),
        }
    }

    fn test_value(&self, v: &Value) -> bool {
        match &self.test {
            Test::Eq(want) => json_eq(v, want),
            Test::Ne(want) => same_kind(v, want) && !json_eq(v, want),
            Test::Order(op, want) => compare(v, want).is_some_and(|ord| op.holds(ord)),
            Test::In(list) => list.iter().any(|want| json_eq(v, want)),
            Test::Contains(want) => match (v, want) {
                (Value::String(s), Value::String(sub)) => s.contains(sub.as_str()),
                (Value::Array(items), _) => items.iter().any(|item| json_eq(item, want)),
                _ => false,
            },
            Test::Prefix(prefix) => v.as_str().is_some_and(|s| s.starts_with(prefix.as_str())),
            Test::Exists | Test::Missing => unreachable!("handled in `holds`"),
        }
    }
}

/// Parses a dotted path; empty paths and empty segments are config errors.
fn parse_path(field: &str) -> Result<FieldPath, String> {
    FieldPath::parse(field)
        .map_err(|_| format!("`field` must be a dotted path like `user.country`, got {field:?}"))
}

fn same_kind(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Equality with numbers compared numerically, recursively.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_cmp(x, y) == Some(Ordering::Equal),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Order of two numbers or two strings; `None` for other kinds or mismatched kinds.
fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_cmp(x, y),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// Exact numeric order of two JSON numbers (integers up to 128 bits, floats).
fn number_cmp(a: &Number, b: &Number) -> Option<Ordering> {
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => Some(x.cmp(&y)),
        (Some(x), None) => int_float_cmp(x, b.as_f64()?),
        (None, Some(y)) => int_float_cmp(y, a.as_f64()?).map(Ordering::reverse),
        (None, None) => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// Compares an integer with a float without rounding the integer.
fn int_float_cmp(i: i128, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    // Beyond ±2^126 (far past any JSON integer serde_json keeps) the float decides.
    const LIMIT: f64 = 8.507_059_173_023_462e37;
    if f >= LIMIT {
        return Some(Ordering::Less);
    }
    if f <= -LIMIT {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    // `whole` is integral and within range, so the cast is exact.
    let whole_int = whole as i128;
    match i.cmp(&whole_int) {
        Ordering::Equal => 0.0_f64.partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

impl TryFrom<RawConfig> for Conditions {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Conditions, String> {
        if raw.any.as_ref().is_some_and(Vec::is_empty) {
            return Err(
                "filter: `any` is empty, so no record could match; remove it or add conditions"
                    .to_string(),
            );
        }
        let parse_all =
            |list: Option<Vec<RawCondition>>, name: &str| -> Result<Vec<Condition>, String> {
                list.unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| Condition::parse(c, &format!("filter: {name}[{i}]")))
                    .collect()
            };
        let all = parse_all(raw.all, "all")?;
        let any = parse_all(raw.any, "any")?;
        if all.is_empty() && any.is_empty() {
            return Err(
                "filter: no conditions; give `all = [...]` and/or `any = [...]`".to_string(),
            );
        }
        Ok(Conditions { all, any })
    }
}

impl Conditions {
    /// Whether a record is kept.
    fn matches(&self, record: &Record) -> bool {
        self.all.iter().all(|c| c.holds(record))
            && (self.any.is_empty() || self.any.iter().any(|c| c.holds(record)))
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::Harness;
    use floe_sdk::{Value, json};

    use super::*;

    fn filter(config: Value) -> Harness<Filter> {
        Harness::new(config).unwrap()
    }

    fn init_error(config: Value) -> String {
        Harness::<Filter>::init_error(config)
    }

    /// Kept unchanged (true) or dropped (false); any other answer fails the test.
    fn kept(h: &mut Harness<Filter>, record: Value) -> bool {
        h.kept(record)
    }

    /// A one-condition filter.
    fn one(field: &str, op: &str, value: Option<Value>) -> Harness<Filter> {
        let mut c = json!({"field": field, "op": op});
        if let Some(v) = value {
            c["value"] = v;
        }
        filter(json!({"all": [c]}))
    }

    #[test]
    fn strings_are_tested_as_their_values_would_be() {
        let strings = ["", "a", "pai", "paid", "paid ", "Paid", "café", "z", "1"];
        let wanted = [
            json!("paid"),
            json!("a"),
            json!(""),
            json!(1),
            json!(["paid", 2, "z"]),
            json!(null),
            json!("pai"),
        ];
        let mut compared = 0;
        for op in [
            "eq", "ne", "gt", "gte", "lt", "lte", "in", "contains", "prefix",
        ] {
            for want in &wanted {
                let raw = RawCondition {
                    field: "s".into(),
                    op: op.into(),
                    value: Some(want.clone()),
                };
                // Some ops refuse some values (`in` needs a list).
                let Ok(c) = Condition::parse(raw, "test") else {
                    continue;
                };
                for s in strings {
                    let as_value = c.test_value(&Value::String(s.into()));
                    assert_eq!(c.test_str(s), as_value, "{op} {want} on {s:?}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 300, "{compared}");
    }

    #[test]
    fn an_escaped_string_is_tested_as_its_text() {
        let mut h = filter(json!({"all": [{"field": "s", "op": "in", "value": ["x", "café"]}]}));
        let kept = |h: &mut Harness<Filter>, json: &[u8]| !h.run_json(json).unwrap().is_empty();
        assert!(kept(&mut h, br#"{"s": "caf\u00e9"}"#));
        assert!(kept(&mut h, br#"{"s": "\u0078"}"#));
        assert!(!kept(&mut h, br#"{"s": "caf\u00e8"}"#));
    }

    #[test]
    fn eq_and_ne_on_strings_numbers_bools_and_null() {
        let mut h = one("status", "eq", Some(json!("paid")));
        assert!(kept(&mut h, json!({"status": "paid", "x": 1})));
        assert!(!kept(&mut h, json!({"status": "open"})));
        assert!(!kept(&mut h, json!({"other": "paid"})));
        assert!(!kept(&mut h, json!({"status": 1})));

        let mut h = one("n", "eq", Some(json!(1)));
        assert!(kept(&mut h, json!({"n": 1})));
        assert!(kept(&mut h, json!({"n": 1.0})));
        assert!(!kept(&mut h, json!({"n": "1"})));

        let mut h = one("ok", "eq", Some(json!(true)));
        assert!(kept(&mut h, json!({"ok": true})));
        assert!(!kept(&mut h, json!({"ok": false})));
        assert!(!kept(&mut h, json!({"ok": 1})));

        let mut h = one("n", "eq", Some(Value::Null));
        assert!(kept(&mut h, json!({"n": null})));
        assert!(!kept(&mut h, json!({})));

        let mut h = one("status", "ne", Some(json!("paid")));
        assert!(kept(&mut h, json!({"status": "open"})));
        assert!(!kept(&mut h, json!({"status": "paid"})));
        assert!(
            !kept(&mut h, json!({"status": 3})),
            "mismatched kinds are false, even for ne"
        );
        assert!(!kept(&mut h, json!({"status": null})));
        assert!(
            !kept(&mut h, json!({})),
            "absent fields are false, even for ne"
        );

        let mut h = one("n", "ne", Some(json!(2)));
        assert!(kept(&mut h, json!({"n": 2.5})));
        assert!(!kept(&mut h, json!({"n": 2.0})));
    }

    #[test]
    fn eq_is_deep_for_arrays_and_objects() {
        let mut h = one("a", "eq", Some(json!({"b": [1, 2], "c": "x"})));
        assert!(kept(&mut h, json!({"a": {"c": "x", "b": [1.0, 2]}})));
        assert!(!kept(&mut h, json!({"a": {"c": "x", "b": [1, 2, 3]}})));
        assert!(!kept(&mut h, json!({"a": {"c": "x"}})));
        assert!(!kept(&mut h, json!({"a": {"c": "x", "b": [1, 2], "d": 0}})));
    }

    #[test]
    fn ordered_ops_on_numbers() {
        for (op, expect) in [
            ("gt", [false, false, true]),
            ("gte", [false, true, true]),
            ("lt", [true, false, false]),
            ("lte", [true, true, false]),
        ] {
            let mut h = one("amount", op, Some(json!(10)));
            for (value, want) in [json!(9.5), json!(10), json!(11)].into_iter().zip(expect) {
                assert_eq!(
                    kept(&mut h, json!({"amount": value})),
                    want,
                    "{value} {op} 10"
                );
            }
            assert!(
                !kept(&mut h, json!({"amount": "11"})),
                "a string is not compared with a number"
            );
            assert!(!kept(&mut h, json!({"amount": true})));
            assert!(!kept(&mut h, json!({"amount": null})));
            assert!(!kept(&mut h, json!({})));
        }
    }

    #[test]
    fn numbers_compare_exactly_across_int_and_float() {
        let mut h = one("n", "gt", Some(json!(-0.5)));
        assert!(kept(&mut h, json!({"n": 0})));
        assert!(!kept(&mut h, json!({"n": -1})));
        let mut h = one("n", "lt", Some(json!(u64::MAX)));
        assert!(kept(&mut h, json!({"n": i64::MIN})));
        assert!(kept(&mut h, json!({"n": u64::MAX - 1})));
        assert!(!kept(&mut h, json!({"n": u64::MAX})));
        assert!(!kept(&mut h, json!({"n": 1e300})));
        // 2^53 + 1 is not representable as f64; compared exactly against 2^53.
        let mut h = one("n", "gt", Some(json!(9_007_199_254_740_992.0)));
        assert!(kept(&mut h, json!({"n": 9_007_199_254_740_993_i64})));
        assert!(!kept(&mut h, json!({"n": 9_007_199_254_740_992_i64})));
    }

    #[test]
    fn ordered_ops_on_strings_are_lexical() {
        let mut h = one("ts", "gte", Some(json!("2024-01-01T00:00:00Z")));
        assert!(kept(&mut h, json!({"ts": "2024-06-01T00:00:00Z"})));
        assert!(kept(&mut h, json!({"ts": "2024-01-01T00:00:00Z"})));
        assert!(!kept(&mut h, json!({"ts": "2023-12-31T23:59:59Z"})));
        assert!(!kept(&mut h, json!({"ts": 20240601})));
        let mut h = one("name", "lt", Some(json!("b")));
        assert!(kept(&mut h, json!({"name": "abc"})));
        assert!(
            kept(&mut h, json!({"name": "B"})),
            "uppercase sorts before lowercase"
        );
        assert!(!kept(&mut h, json!({"name": "b"})));
    }

    #[test]
    fn in_matches_any_listed_value() {
        let mut h = one("user.country", "in", Some(json!(["DE", "FR", 7])));
        assert!(kept(&mut h, json!({"user": {"country": "DE"}})));
        assert!(kept(&mut h, json!({"user": {"country": 7.0}})));
        assert!(!kept(&mut h, json!({"user": {"country": "US"}})));
        assert!(!kept(&mut h, json!({"user": {}})));
        assert!(
            !kept(&mut h, json!({"user": "DE"})),
            "a path through a non-object finds nothing"
        );
        assert!(
            !kept(&mut h, json!({"user.country": "DE"})),
            "dots always mean nesting"
        );
        let mut h = one("x", "in", Some(json!([])));
        assert!(!kept(&mut h, json!({"x": 1})));
    }

    #[test]
    fn exists_and_missing_treat_null_as_missing() {
        let mut h = one("a.b", "exists", None);
        assert!(kept(&mut h, json!({"a": {"b": 0}})));
        assert!(kept(&mut h, json!({"a": {"b": false}})));
        assert!(kept(&mut h, json!({"a": {"b": {}}})));
        assert!(!kept(&mut h, json!({"a": {"b": null}})));
        assert!(!kept(&mut h, json!({"a": {}})));
        assert!(!kept(&mut h, json!({"a": [{"b": 1}]})));
        assert!(!kept(&mut h, json!({})));

        let mut h = one("a.b", "missing", None);
        assert!(!kept(&mut h, json!({"a": {"b": 0}})));
        assert!(kept(&mut h, json!({"a": {"b": null}})));
        assert!(kept(&mut h, json!({"a": {}})));
        assert!(kept(&mut h, json!({"a": 5})));
        assert!(kept(&mut h, json!({})));
    }

    #[test]
    fn contains_substring_or_array_element() {
        let mut h = one("tags", "contains", Some(json!("vip")));
        assert!(kept(&mut h, json!({"tags": ["new", "vip"]})));
        assert!(!kept(&mut h, json!({"tags": ["new", "vipx"]})));
        assert!(kept(&mut h, json!({"tags": "very vip person"})));
        assert!(!kept(&mut h, json!({"tags": "VIP"})), "case-sensitive");
        assert!(!kept(&mut h, json!({"tags": []})));
        assert!(
            !kept(&mut h, json!({"tags": {"vip": true}})),
            "objects are not searched"
        );
        assert!(!kept(&mut h, json!({})));

        let mut h = one("ids", "contains", Some(json!(3)));
        assert!(kept(&mut h, json!({"ids": [1, 2, 3.0]})));
        assert!(
            !kept(&mut h, json!({"ids": "123"})),
            "a number is not a substring"
        );

        let mut h = one("s", "contains", Some(json!("")));
        assert!(kept(&mut h, json!({"s": "anything"})));
    }

    #[test]
    fn prefix_on_strings_only() {
        let mut h = one("url", "prefix", Some(json!("https://")));
        assert!(kept(&mut h, json!({"url": "https://example.com"})));
        assert!(!kept(&mut h, json!({"url": "http://example.com"})));
        assert!(!kept(&mut h, json!({"url": ["https://"]})));
        assert!(!kept(&mut h, json!({"url": null})));
        let mut h = one("s", "prefix", Some(json!("é")));
        assert!(kept(&mut h, json!({"s": "été"})));
    }

    #[test]
    fn all_and_any_combine() {
        let mut h = filter(json!({
            "all": [
                {"field": "status", "op": "eq", "value": "paid"},
                {"field": "amount", "op": "gte", "value": 10},
            ],
            "any": [
                {"field": "user.country", "op": "in", "value": ["DE", "FR"]},
                {"field": "tags", "op": "contains", "value": "vip"},
            ],
        }));
        assert!(kept(
            &mut h,
            json!({"status": "paid", "amount": 10, "user": {"country": "DE"}})
        ));
        assert!(kept(
            &mut h,
            json!({"status": "paid", "amount": 99, "user": {"country": "US"}, "tags": ["vip"]})
        ));
        assert!(
            !kept(
                &mut h,
                json!({"status": "paid", "amount": 99, "user": {"country": "US"}})
            ),
            "no `any` holds"
        );
        assert!(
            !kept(
                &mut h,
                json!({"status": "paid", "amount": 9, "user": {"country": "DE"}})
            ),
            "one `all` fails"
        );
        assert!(!kept(
            &mut h,
            json!({"status": "open", "amount": 99, "tags": ["vip"]})
        ));
    }

    #[test]
    fn any_alone_and_all_alone() {
        let mut h = filter(json!({"any": [
            {"field": "a", "op": "exists"},
            {"field": "b", "op": "eq", "value": 1},
        ]}));
        assert!(kept(&mut h, json!({"a": 0})));
        assert!(kept(&mut h, json!({"b": 1})));
        assert!(!kept(&mut h, json!({"b": 2})));

        let mut h = filter(json!({"all": [
            {"field": "a", "op": "exists"},
            {"field": "b", "op": "eq", "value": 1},
        ]}));
        assert!(kept(&mut h, json!({"a": 0, "b": 1})));
        assert!(!kept(&mut h, json!({"b": 1})));
        // `all = []` with a non-empty `any`: only `any` decides.
        let mut h = filter(json!({"all": [], "any": [{"field": "a", "op": "exists"}]}));
        assert!(kept(&mut h, json!({"a": 1})));
        assert!(!kept(&mut h, json!({})));
    }

    #[test]
    fn keeps_record_and_metadata_untouched_across_many_records() {
        let mut h = one("keep", "eq", Some(json!(true)));
        let kept_count = (0..100)
            .filter(|i| kept(&mut h, json!({"keep": i % 3 == 0, "i": i})))
            .count();
        assert_eq!(kept_count, 34);
    }

    #[test]
    fn bad_config_fails_init() {
        let e = init_error(json!({}));
        assert!(e.contains("no conditions"), "{e}");
        let e = init_error(Value::Null);
        assert!(e.contains("no conditions"), "{e}");
        let e = init_error(json!({"all": []}));
        assert!(e.contains("no conditions"), "{e}");
        let e = init_error(json!({"any": []}));
        assert!(e.contains("`any` is empty"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "equals", "value": 1}]}));
        assert!(
            e.contains("all[0]") && e.contains("unknown op `equals`"),
            "{e}"
        );
        let e = init_error(
            json!({"any": [{"field": "a", "op": "exists"}, {"field": "b", "op": "eq"}]}),
        );
        assert!(e.contains("any[1]") && e.contains("needs a `value`"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "gt", "value": [1]}]}));
        assert!(e.contains("number or a string"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "in", "value": "DE"}]}));
        assert!(e.contains("needs a list"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "prefix", "value": 1}]}));
        assert!(e.contains("needs a string"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "exists", "value": true}]}));
        assert!(e.contains("takes no `value`"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "missing", "value": null}]}));
        assert!(e.contains("takes no `value`"), "{e}");
        for field in ["", "a.", ".a", "a..b"] {
            let e = init_error(json!({"all": [{"field": field, "op": "exists"}]}));
            assert!(e.contains("dotted path"), "{e}");
        }
        let e = init_error(json!({"all": [{"op": "exists"}]}));
        assert!(e.contains("missing field `field`"), "{e}");
        let e = init_error(json!({"all": [{"field": "a", "op": "exists", "values": 1}]}));
        assert!(e.contains("unknown field `values`"), "{e}");
        let e = init_error(json!({"alll": [{"field": "a", "op": "exists"}]}));
        assert!(e.contains("unknown field `alll`"), "{e}");
        let e = init_error(json!({"all": {"field": "a", "op": "exists"}}));
        assert!(e.contains("invalid plugin config"), "{e}");
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = one("a", "exists", None);
        // The agent only hands plugins JSON objects; the harness checks inputs the same way.
        let e = h.run_json(b"[1, 2]").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
        let e = h.run_json(b"{nope").unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        // The plugin keeps working afterwards.
        assert!(kept(&mut h, json!({"a": 1})));
    }
}
