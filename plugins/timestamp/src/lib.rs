//! `timestamp`: parses a timestamp field written in a known format and replaces it
//! (or writes `target`) with an RFC 3339 string in UTC with microseconds, e.g.
//! `"2024-01-02T03:04:05.123456Z"`, which Floe infers as a `timestamptz` column.
//!
//! # Config
//!
//! ```toml
//! [[pipelines.transforms]]
//! uses = "timestamp"   # timestamp.wasm in the plugin path (docs/plugins.md)
//! [pipelines.transforms.with]
//! field = "event.time"            # dotted path of the value to parse
//! format = "%d/%m/%Y %H:%M:%S"    # or "epoch_seconds", "epoch_millis", "epoch_micros", "rfc2822"
//! offset = "+02:00"               # optional: zone of values without one, default UTC
//! target = "event_ts"             # optional: where to write, default `field` itself
//! required = false                # optional: a missing/null field is an error, default false
//! ```
//!
//! - `field` (required string): dotted path (`event.time` is the `time` key of the
//!   object under `event`).
//! - `format` (required string), one of:
//!   - `"epoch_seconds"`, `"epoch_millis"`, `"epoch_micros"`: a count since the Unix
//!     epoch, as a JSON number or a numeric string (`1700000000`, `"1700000000.5"`,
//!     `-12`, `1.7e9`). Fractions are kept down to the microsecond; digits below are
//!     cut off.
//!   - `"rfc2822"`: e.g. `"Tue, 1 Jul 2003 10:52:37 +0200"`; the value's own zone is
//!     used.
//!   - anything else is a [chrono strftime format](https://docs.rs/chrono/latest/chrono/format/strftime/index.html)
//!     such as `"%Y-%m-%d %H:%M:%S%.f"` or `"%d/%m/%Y"`. A value with its own offset
//!     (`%z`, `%:z`, `%+`) uses it; otherwise `offset` applies. A format without a
//!     time of day means midnight, one with hours but no minutes means minute 0.
//!     A JSON number is parsed as its text (`20240102` with `"%Y%m%d"`).
//! - `offset` (optional string, default UTC): the zone of values that do not carry
//!   one, as `"+02:00"`, `"-0530"`, `"+02"`, `"Z"` or `"UTC"`.
//! - `target` (optional string, default `field`): dotted path the result is written
//!   to; an existing value there is replaced and absent (or null) parent objects are
//!   created. With a `target`, `field` is left as it was.
//! - `required` (optional bool, default false): by default a record whose field is
//!   missing or null passes unchanged; with `required = true` it is a per-record error.
//!
//! Per-record errors name the field and the format: a value that does not parse, a
//! value of the wrong kind (booleans, arrays, objects), a result outside the years
//! 0000-9999, a `target` whose parent path runs through a non-object. Config errors:
//! a missing `field` or `format`, an invalid strftime format, a bad `offset`, an
//! empty path or path segment, an unknown key.

use chrono::format::{Item, Parsed, StrftimeItems};
use chrono::{DateTime, Datelike, FixedOffset, SecondsFormat, TimeZone, Utc};
use floe_sdk::json::Kind;
use floe_sdk::path::FieldPath;
use floe_sdk::{Answer, Error, Patch, Record, Value, error, map};
use serde::Deserialize;

/// Parses the configured field into an RFC 3339 UTC timestamp.
#[map(Timestamp)]
fn timestamp(record: &Record, config: &Config) -> Result<Answer, Error> {
    let found = record.get(&config.field).filter(|v| !v.is_null());
    let Some(found) = found else {
        if config.required {
            return Err(error!(
                "timestamp: field `{}` is missing or null",
                config.field
            ));
        }
        return Ok(Answer::UNCHANGED);
    };
    let found = found.to_value()?;
    let instant = config.parse(&found).map_err(|e| {
        error!(
            "timestamp: cannot parse field `{}` = {} with format {:?}: {e}",
            config.field,
            show(&found),
            config.format_name
        )
    })?;
    if !(0..=9999).contains(&instant.year()) {
        return Err(error!(
            "timestamp: field `{}` = {} with format {:?} is outside the years 0000-9999",
            config.field,
            show(&found),
            config.format_name
        ));
    }
    // Absent (or null) parent objects are created; anything else is in the way.
    let parents = config.target.parent_segments();
    for depth in 1..=parents.len() {
        match record.get(&parents[..depth]).map(|v| v.kind()) {
            None | Some(Kind::Null) => break,
            Some(Kind::Object) => {}
            Some(_) => {
                return Err(error!(
                    "timestamp: cannot write `{}`: `{}` is not an object",
                    config.target,
                    parents[..depth].join(".")
                ));
            }
        }
    }
    let text = instant.to_rfc3339_opts(SecondsFormat::Micros, true);
    Ok(Patch::new().set(&config.target, text).into())
}

/// The parsed config.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfig")]
struct Config {
    field: FieldPath,
    target: FieldPath,
    format: Format,
    /// The config's `format` text, for error messages.
    format_name: String,
    offset: FixedOffset,
    required: bool,
}

#[derive(Debug)]
enum Format {
    /// Count since the epoch; the power of ten of the unit relative to seconds
    /// (0 for seconds, 3 for millis, 6 for micros).
    Epoch(u32),
    Rfc2822,
    Strftime(Vec<Item<'static>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    field: String,
    format: String,
    offset: Option<String>,
    target: Option<String>,
    #[serde(default)]
    required: bool,
}

fn parse_path(path: &str, name: &str) -> Result<FieldPath, String> {
    FieldPath::parse(path).map_err(|_| {
        format!("timestamp: `{name}` must be a dotted path like `event.time`, got {path:?}")
    })
}

/// Parses `Z`, `UTC`, `+HH:MM`, `-HHMM` or `+HH`.
pub fn parse_offset(text: &str) -> Option<FixedOffset> {
    if text == "Z" || text.eq_ignore_ascii_case("utc") {
        return FixedOffset::east_opt(0);
    }
    let sign = match text.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = text[1..].chars().filter(|c| *c != ':').collect();
    let colons = text[1..].matches(':').count();
    if !digits.bytes().all(|b| b.is_ascii_digit())
        || colons > 1
        || (colons == 1 && (text.len() != 6 || text.as_bytes()[3] != b':'))
    {
        return None;
    }
    let (hours, minutes) = match digits.len() {
        2 => (digits.parse::<i32>().ok()?, 0),
        4 => (
            digits[..2].parse::<i32>().ok()?,
            digits[2..].parse::<i32>().ok()?,
        ),
        _ => return None,
    };
    if hours > 23 || minutes > 59 {
        return None;
    }
    FixedOffset::east_opt(sign * (hours * 3600 + minutes * 60))
}

/// Parses a decimal count of `10^-unit_exp` seconds since the epoch, exactly.
pub fn parse_epoch(text: &str, unit_exp: u32) -> Result<DateTime<Utc>, String> {
    const NOT_A_NUMBER: &str = "not a number";
    let s = text.trim();
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (
            &rest[..i],
            rest[i + 1..].parse::<i32>().map_err(|_| NOT_A_NUMBER)?,
        ),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if (int_part.is_empty() && frac_part.is_empty())
        || !all_digits(int_part)
        || !all_digits(frac_part)
    {
        return Err(NOT_A_NUMBER.to_string());
    }
    if !(-400..=400).contains(&exp) {
        return Err("out of range".to_string());
    }
    // Nanoseconds = digits * 10^scale, where only fraction digits that can matter are kept.
    let to_nanos = 9 - unit_exp as i32 + exp;
    let keep = usize::try_from(to_nanos.max(0))
        .unwrap_or(0)
        .min(frac_part.len());
    let frac_part = &frac_part[..keep];
    let scale = to_nanos - keep as i32;
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let out_of_range = || "out of range".to_string();
    if digits.len() > 38 {
        return Err(out_of_range());
    }
    let mut nanos: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| out_of_range())?
    };
    if scale >= 0 {
        nanos = 10_i128
            .checked_pow(scale as u32)
            .and_then(|p| nanos.checked_mul(p))
            .ok_or_else(out_of_range)?;
    } else {
        nanos = 10_i128
            .checked_pow(scale.unsigned_abs())
            .map_or(0, |p| nanos / p);
    }
    if negative {
        nanos = -nanos;
    }
    let secs = i64::try_from(nanos.div_euclid(1_000_000_000)).map_err(|_| out_of_range())?;
    let sub = u32::try_from(nanos.rem_euclid(1_000_000_000)).expect("below 10^9");
    DateTime::from_timestamp(secs, sub).ok_or_else(out_of_range)
}

/// Parses `text` with strftime items; `offset` applies when the text has none.
fn parse_strftime(
    text: &str,
    items: &[Item<'static>],
    offset: &FixedOffset,
) -> Result<DateTime<Utc>, String> {
    let mut parsed = Parsed::new();
    chrono::format::parse(&mut parsed, text, items.iter()).map_err(|e| e.to_string())?;
    if parsed.offset().is_some() {
        return parsed
            .to_datetime()
            .map(|dt| dt.with_timezone(&Utc))
            .map_err(|e| e.to_string());
    }
    if parsed.timestamp().is_some() {
        // `%s` is an instant already.
        return parsed
            .to_naive_datetime_with_offset(0)
            .map(|dt| dt.and_utc())
            .map_err(|e| e.to_string());
    }
    if parsed.hour_div_12().is_none() && parsed.hour_mod_12().is_none() {
        parsed.set_hour(0).map_err(|e| e.to_string())?;
    }
    if parsed.minute().is_none() {
        parsed.set_minute(0).map_err(|e| e.to_string())?;
    }
    let local = parsed
        .to_naive_datetime_with_offset(0)
        .map_err(|e| e.to_string())?;
    offset
        .from_local_datetime(&local)
        .single()
        .map(|dt| dt.with_timezone(&Utc))
        .ok_or_else(|| "out of range".to_string())
}

/// A value for an error message, shortened if long.
fn show(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 64 {
        text
    } else {
        format!("{}...", text.chars().take(64).collect::<String>())
    }
}

impl Config {
    /// Parses one value into a UTC instant.
    fn parse(&self, value: &Value) -> Result<DateTime<Utc>, String> {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) if !matches!(self.format, Format::Rfc2822) => n.to_string(),
            _ => {
                let expected = match self.format {
                    Format::Epoch(_) => "a number or a numeric string",
                    _ => "a string",
                };
                return Err(format!("expected {expected}"));
            }
        };
        match &self.format {
            Format::Epoch(unit_exp) => parse_epoch(&text, *unit_exp),
            Format::Rfc2822 => DateTime::parse_from_rfc2822(&text)
                .map(|dt| dt.with_timezone(&Utc))
                .map_err(|e| e.to_string()),
            Format::Strftime(items) => parse_strftime(&text, items, &self.offset),
        }
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Config, String> {
        let field = parse_path(&raw.field, "field")?;
        let target = match &raw.target {
            Some(target) => parse_path(target, "target")?,
            None => field.clone(),
        };
        let format = match raw.format.as_str() {
            "epoch_seconds" => Format::Epoch(0),
            "epoch_millis" => Format::Epoch(3),
            "epoch_micros" => Format::Epoch(6),
            "rfc2822" => Format::Rfc2822,
            "" => return Err("timestamp: `format` is empty".to_string()),
            fmt => Format::Strftime(StrftimeItems::new(fmt).parse_to_owned().map_err(|e| {
                format!("timestamp: `format` {fmt:?} is not a valid strftime format: {e}")
            })?),
        };
        let offset = match &raw.offset {
            None => FixedOffset::east_opt(0).expect("zero offset"),
            Some(text) => parse_offset(text)
                .ok_or_else(|| format!("timestamp: `offset` must look like \"+02:00\", \"-0530\" or \"Z\", got {text:?}"))?,
        };
        Ok(Config {
            field,
            target,
            format,
            format_name: raw.format,
            offset,
            required: raw.required,
        })
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::testing::Harness;
    use floe_sdk::{Value, json};

    use super::*;

    fn timestamp(config: Value) -> Harness<Timestamp> {
        Harness::new(config).unwrap()
    }

    /// The converted `ts` of `{"ts": value}` with format `format`.
    fn convert(format: &str, value: Value) -> Result<String, String> {
        let mut h = timestamp(json!({"field": "ts", "format": format}));
        let mut out = h.run(json!({"ts": value})).map_err(|e| e.to_string())?;
        Ok(out.remove(0).value["ts"].as_str().unwrap().to_string())
    }

    fn init_error(config: Value) -> String {
        Harness::<Timestamp>::init_error(config)
    }

    #[test]
    fn epoch_seconds() {
        assert_eq!(
            convert("epoch_seconds", json!(1_704_164_645)).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!("1704164645")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(1_704_164_645.123_456)).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!("1704164645.1234567")).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(0)).unwrap(),
            "1970-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(-1)).unwrap(),
            "1969-12-31T23:59:59.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!("-0.5")).unwrap(),
            "1969-12-31T23:59:59.500000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(1.7e9)).unwrap(),
            "2023-11-14T22:13:20.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!("17E8")).unwrap(),
            "2023-11-14T22:13:20.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(" +1704164645 ")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert("epoch_seconds", json!(".5")).unwrap(),
            "1970-01-01T00:00:00.500000Z"
        );
    }

    #[test]
    fn epoch_millis_and_micros() {
        assert_eq!(
            convert("epoch_millis", json!(1_704_164_645_123_i64)).unwrap(),
            "2024-01-02T03:04:05.123000Z"
        );
        assert_eq!(
            convert("epoch_millis", json!("1704164645123.456")).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("epoch_millis", json!(-1)).unwrap(),
            "1969-12-31T23:59:59.999000Z"
        );
        assert_eq!(
            convert("epoch_micros", json!(1_704_164_645_123_456_i64)).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("epoch_micros", json!("1704164645123456")).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("epoch_micros", json!(1.5)).unwrap(),
            "1970-01-01T00:00:00.000001Z"
        );
    }

    #[test]
    fn epoch_errors_name_field_and_format() {
        let err = convert("epoch_millis", json!("yesterday")).unwrap_err();
        assert_eq!(
            err,
            "timestamp: cannot parse field `ts` = \"yesterday\" with format \"epoch_millis\": not a number"
        );
        for bad in [
            json!(""),
            json!("1.2.3"),
            json!("1e"),
            json!("--1"),
            json!("0x10"),
            json!("1 2"),
            json!("."),
            json!("NaN"),
        ] {
            let err = convert("epoch_seconds", bad.clone()).unwrap_err();
            assert!(err.contains("not a number"), "{bad}: {err}");
        }
        let err = convert("epoch_seconds", json!(true)).unwrap_err();
        assert!(
            err.contains("`ts` = true") && err.contains("expected a number or a numeric string"),
            "{err}"
        );
        let err = convert("epoch_seconds", json!([1])).unwrap_err();
        assert!(err.contains("expected a number"), "{err}");
        let err = convert("epoch_seconds", json!(1e300)).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        let err = convert("epoch_seconds", json!("1e1000")).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        let err = convert("epoch_seconds", json!(i64::MAX)).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        // Year 10000 is representable by chrono but not by RFC 3339.
        let err = convert("epoch_seconds", json!(253_402_300_800_i64)).unwrap_err();
        assert!(err.contains("outside the years 0000-9999"), "{err}");
        assert_eq!(
            convert("epoch_seconds", json!(253_402_300_799_i64)).unwrap(),
            "9999-12-31T23:59:59.000000Z"
        );
    }

    #[test]
    fn rfc2822_uses_its_own_zone() {
        assert_eq!(
            convert("rfc2822", json!("Tue, 1 Jul 2003 10:52:37 +0200")).unwrap(),
            "2003-07-01T08:52:37.000000Z"
        );
        assert_eq!(
            convert("rfc2822", json!("Tue, 1 Jul 2003 10:52:37 GMT")).unwrap(),
            "2003-07-01T10:52:37.000000Z"
        );
        let mut h = timestamp(json!({"field": "ts", "format": "rfc2822", "offset": "+05:00"}));
        assert_eq!(
            h.run_one(json!({"ts": "1 Jul 2003 10:52:37 -0000"})),
            json!({"ts": "2003-07-01T10:52:37.000000Z"})
        );
        let err = convert("rfc2822", json!("2003-07-01T10:52:37Z")).unwrap_err();
        assert!(err.starts_with("timestamp: cannot parse field `ts` = \"2003-07-01T10:52:37Z\" with format \"rfc2822\": "), "{err}");
        let err = convert("rfc2822", json!(1_057_056_757)).unwrap_err();
        assert!(err.contains("expected a string"), "{err}");
    }

    #[test]
    fn strftime_without_zone_uses_utc_by_default() {
        assert_eq!(
            convert("%d/%m/%Y %H:%M:%S", json!("02/01/2024 03:04:05")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert(
                "%Y-%m-%d %H:%M:%S%.f",
                json!("2024-01-02 03:04:05.123456789")
            )
            .unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        assert_eq!(
            convert("%Y-%m-%d %H:%M:%S%.f", json!("2024-01-02 03:04:05.5")).unwrap(),
            "2024-01-02T03:04:05.500000Z"
        );
        assert_eq!(
            convert("%Y-%m-%d", json!("2024-01-02")).unwrap(),
            "2024-01-02T00:00:00.000000Z"
        );
        assert_eq!(
            convert("%Y-%m-%d %H", json!("2024-01-02 13")).unwrap(),
            "2024-01-02T13:00:00.000000Z"
        );
        assert_eq!(
            convert("%Y-%m-%d %I:%M %p", json!("2024-01-02 01:30 PM")).unwrap(),
            "2024-01-02T13:30:00.000000Z"
        );
        assert_eq!(
            convert("%Y%m%d", json!(20_240_102)).unwrap(),
            "2024-01-02T00:00:00.000000Z"
        );
        assert_eq!(
            convert("%s", json!("1704164645")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
    }

    #[test]
    fn strftime_with_its_own_zone() {
        assert_eq!(
            convert("%Y-%m-%dT%H:%M:%S%:z", json!("2024-01-02T05:04:05+02:00")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert("%Y-%m-%d %H:%M:%S %z", json!("2024-01-02 00:04:05 -0300")).unwrap(),
            "2024-01-02T03:04:05.000000Z"
        );
        assert_eq!(
            convert("%+", json!("2024-01-02T03:04:05.123456+00:00")).unwrap(),
            "2024-01-02T03:04:05.123456Z"
        );
        // The value's zone wins over `offset`.
        let mut h =
            timestamp(json!({"field": "ts", "format": "%Y-%m-%dT%H:%M:%S%:z", "offset": "-07:00"}));
        assert_eq!(
            h.run_one(json!({"ts": "2024-01-02T05:04:05+02:00"})),
            json!({"ts": "2024-01-02T03:04:05.000000Z"})
        );
    }

    #[test]
    fn offset_applies_to_values_without_zone() {
        let mut h =
            timestamp(json!({"field": "ts", "format": "%d/%m/%Y %H:%M:%S", "offset": "+02:00"}));
        assert_eq!(
            h.run_one(json!({"ts": "02/01/2024 05:04:05"})),
            json!({"ts": "2024-01-02T03:04:05.000000Z"})
        );
        assert_eq!(
            h.run_one(json!({"ts": "01/01/2024 01:00:00"})),
            json!({"ts": "2023-12-31T23:00:00.000000Z"})
        );
        let mut h = timestamp(json!({"field": "ts", "format": "%Y-%m-%d", "offset": "-0530"}));
        assert_eq!(
            h.run_one(json!({"ts": "2024-01-02"})),
            json!({"ts": "2024-01-02T05:30:00.000000Z"})
        );
        // Epoch values are instants: `offset` does not move them.
        let mut h =
            timestamp(json!({"field": "ts", "format": "epoch_seconds", "offset": "+02:00"}));
        assert_eq!(
            h.run_one(json!({"ts": 0})),
            json!({"ts": "1970-01-01T00:00:00.000000Z"})
        );
    }

    #[test]
    fn strftime_errors_name_field_and_format() {
        let err = convert("%d/%m/%Y %H:%M:%S", json!("2024-01-02 03:04:05")).unwrap_err();
        assert!(
            err.starts_with("timestamp: cannot parse field `ts` = \"2024-01-02 03:04:05\" with format \"%d/%m/%Y %H:%M:%S\": "),
            "{err}"
        );
        for bad in [
            json!("31/02/2024 00:00:00"),
            json!("02/01/2024 25:00:00"),
            json!("02/01/2024 03:04:05 extra"),
            json!(""),
        ] {
            let err = convert("%d/%m/%Y %H:%M:%S", bad.clone()).unwrap_err();
            assert!(err.contains("cannot parse field `ts`"), "{bad}: {err}");
        }
        let err = convert("%H:%M", json!("03:04")).unwrap_err();
        assert!(
            err.contains("cannot parse"),
            "a format without a date cannot make an instant: {err}"
        );
        let err = convert("%Y-%m-%d", json!({"y": 2024})).unwrap_err();
        assert!(err.contains("expected a string"), "{err}");
        let long = "x".repeat(500);
        let err = convert("%Y", json!(long)).unwrap_err();
        assert!(err.len() < 200, "long values are shortened: {err}");
    }

    #[test]
    fn nested_field_and_target() {
        let mut h = timestamp(
            json!({"field": "event.time", "format": "epoch_millis", "target": "meta.ts"}),
        );
        assert_eq!(
            h.run_one(json!({"event": {"time": 1_704_164_645_123_i64}, "meta": {"k": 1}})),
            json!({"event": {"time": 1_704_164_645_123_i64}, "meta": {"k": 1, "ts": "2024-01-02T03:04:05.123000Z"}})
        );
        assert_eq!(
            h.run_one(json!({"event": {"time": 0}})),
            json!({"event": {"time": 0}, "meta": {"ts": "1970-01-01T00:00:00.000000Z"}})
        );
        assert_eq!(
            h.run_one(json!({"event": {"time": 0}, "meta": null})),
            json!({"event": {"time": 0}, "meta": {"ts": "1970-01-01T00:00:00.000000Z"}})
        );
        let err = h.run(json!({"event": {"time": 0}, "meta": 5})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "timestamp: cannot write `meta.ts`: `meta` is not an object"
        );

        let mut h =
            timestamp(json!({"field": "ts", "format": "epoch_seconds", "target": "ts_parsed"}));
        let out = h.run_one(json!({"ts": 0, "ts_parsed": "old", "z": 1}));
        assert_eq!(
            out,
            json!({"ts": 0, "ts_parsed": "1970-01-01T00:00:00.000000Z", "z": 1})
        );
    }

    #[test]
    fn overwrites_in_place_keeping_order() {
        let mut h = timestamp(json!({"field": "ts", "format": "epoch_seconds"}));
        let out = h.run_one(json!({"a": 1, "ts": 0, "b": 2}));
        assert_eq!(
            out.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["a", "ts", "b"]
        );
    }

    #[test]
    fn missing_or_null_field() {
        let mut h =
            timestamp(json!({"field": "event.time", "format": "epoch_seconds", "target": "ts"}));
        for record in [
            json!({"a": 1}),
            json!({"event": {"time": null}}),
            json!({"event": "x"}),
        ] {
            assert_eq!(h.run_one(record.clone()), record);
        }
        let mut h =
            timestamp(json!({"field": "event.time", "format": "epoch_seconds", "required": true}));
        let err = h.run(json!({"a": 1})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "timestamp: field `event.time` is missing or null"
        );
        assert!(h.run(json!({"event": {"time": null}})).is_err());
        assert!(h.run(json!({"event": {"time": 1}})).is_ok());
    }

    #[test]
    fn offsets() {
        let secs = |t: &str| parse_offset(t).map(|o| o.local_minus_utc());
        assert_eq!(secs("Z"), Some(0));
        assert_eq!(secs("UTC"), Some(0));
        assert_eq!(secs("+02:00"), Some(7200));
        assert_eq!(secs("-05:30"), Some(-19800));
        assert_eq!(secs("+0530"), Some(19800));
        assert_eq!(secs("+02"), Some(7200));
        assert_eq!(secs("-00:00"), Some(0));
        for bad in [
            "",
            "+",
            "2",
            "02:00",
            "+2:00",
            "+24:00",
            "+02:60",
            "+02:0",
            "+020:0",
            "+0:200",
            "+02::00",
            "+0a:00",
            "CET",
            "+02:00:00",
        ] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_config_fails_init() {
        let e = init_error(json!({"format": "epoch_seconds"}));
        assert!(e.contains("missing field `field`"), "{e}");
        let e = init_error(json!({"field": "ts"}));
        assert!(e.contains("missing field `format`"), "{e}");
        let e = init_error(Value::Null);
        assert!(e.contains("missing field"), "{e}");
        let e = init_error(json!({"field": "ts", "format": ""}));
        assert!(e.contains("`format` is empty"), "{e}");
        let e = init_error(json!({"field": "ts", "format": "%Y-%Q"}));
        assert!(e.contains("not a valid strftime format"), "{e}");
        let e = init_error(json!({"field": "ts", "format": "%Y", "offset": "CET"}));
        assert!(e.contains("`offset` must look like"), "{e}");
        let e = init_error(json!({"field": "a..b", "format": "%Y"}));
        assert!(e.contains("`field` must be a dotted path"), "{e}");
        let e = init_error(json!({"field": "a", "format": "%Y", "target": ""}));
        assert!(e.contains("`target` must be a dotted path"), "{e}");
        let e = init_error(json!({"field": "a", "format": 5}));
        assert!(e.contains("invalid plugin config"), "{e}");
        let e = init_error(json!({"field": "a", "format": "%Y", "tz": "+02:00"}));
        assert!(e.contains("unknown field `tz`"), "{e}");
    }

    #[test]
    fn epoch_parser() {
        let nanos =
            |t: &str, unit: u32| parse_epoch(t, unit).map(|dt| dt.timestamp_nanos_opt().unwrap());
        assert_eq!(nanos("1", 0), Ok(1_000_000_000));
        assert_eq!(nanos("1", 3), Ok(1_000_000));
        assert_eq!(nanos("1", 6), Ok(1_000));
        assert_eq!(nanos("0.000000001", 0), Ok(1));
        assert_eq!(nanos("0.0000000019", 0), Ok(1));
        assert_eq!(nanos("1e-9", 0), Ok(1));
        assert_eq!(nanos("1e-10", 0), Ok(0));
        assert_eq!(nanos("-1.5e3", 3), Ok(-1_500_000_000));
        assert_eq!(nanos("000012", 0), Ok(12_000_000_000));
        assert_eq!(nanos("12.", 0), Ok(12_000_000_000));
        assert_eq!(
            nanos("1234567890.123456789012345678901234567890123", 0),
            Ok(1_234_567_890_123_456_789)
        );
    }

    #[test]
    fn input_that_is_not_an_object_is_a_record_error() {
        let mut h = timestamp(json!({"field": "ts", "format": "epoch_seconds"}));
        let e = h.run_json(b"\"2024\"").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
