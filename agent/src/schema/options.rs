//! `[pipelines.schema]`: how types are inferred and what happens on incompatible values.

use std::collections::{BTreeMap, HashMap};

use iceberg::spec::{PrimitiveType, Type};
use serde::Deserialize;

/// Per-pipeline schema settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaConfig {
    /// Detect ISO-8601 date-time strings as timestamp / timestamptz (default true).
    /// Off: every JSON string is a string (use `overrides` for single fields).
    #[serde(default = "yes")]
    pub detect_timestamps: bool,
    /// A field seen only as null in this many records becomes a string column.
    /// Default: never (the field waits for a typed value).
    #[serde(default)]
    pub null_as_string_after: Option<u64>,
    /// What happens to a record whose value does not fit its column.
    #[serde(default)]
    pub on_incompatible: OnIncompatible,
    /// Forced types by dotted field path, e.g. `"price" = "decimal(18,2)"`,
    /// `"user.birthday" = "date"`. Types: boolean, int, long, float, double,
    /// decimal(P,S), date, time, timestamp, timestamptz, string, uuid, binary, fixed[N].
    #[serde(default)]
    pub overrides: BTreeMap<String, String>,
    /// Records nested deeper than this go to the dead letters (default 20, at most 32:
    /// deeper columns would make the table's metadata unreadable for many readers).
    #[serde(default = "default_max_depth")]
    pub max_depth: usize,
    /// A record that would take the table past this many columns (nested ones
    /// included) goes to the dead letters (default 2000).
    #[serde(default = "default_max_columns")]
    pub max_columns: usize,
}

fn yes() -> bool {
    true
}

/// The deepest nesting `max_depth` may allow.
pub const MAX_DEPTH_LIMIT: usize = 32;

fn default_max_depth() -> usize {
    20
}

fn default_max_columns() -> usize {
    2000
}

impl Default for SchemaConfig {
    fn default() -> Self {
        SchemaConfig {
            detect_timestamps: true,
            null_as_string_after: None,
            on_incompatible: OnIncompatible::default(),
            overrides: BTreeMap::new(),
            max_depth: default_max_depth(),
            max_columns: default_max_columns(),
        }
    }
}

/// Policy for a value whose type does not fit its column.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnIncompatible {
    /// Stop the pipeline with an error naming field, column type, value type and offset.
    Fail,
    /// Write the record to the dead-letter destination with the reason (default).
    #[default]
    DeadLetter,
    /// Store the value as its JSON text where the column is a string; otherwise dead-letter.
    Coerce,
}

impl SchemaConfig {
    /// Problems a valid TOML section can still have, as (field, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, ty) in &self.overrides {
            if let Err(e) = parse_type(ty) {
                out.push((format!("overrides.{path}"), e.to_string()));
            }
        }
        if !(1..=MAX_DEPTH_LIMIT).contains(&self.max_depth) {
            out.push((
                "max_depth".into(),
                format!("must be between 1 and {MAX_DEPTH_LIMIT}"),
            ));
        }
        if self.max_columns == 0 {
            out.push(("max_columns".into(), "must be at least 1".into()));
        }
        if self.null_as_string_after == Some(0) {
            out.push((
                "null_as_string_after".into(),
                "must be at least 1".to_string(),
            ));
        }
        out
    }

    /// The settings the tracker uses (override types parsed).
    pub fn options(&self) -> SchemaOptions {
        SchemaOptions {
            detect_timestamps: self.detect_timestamps,
            null_as_string_after: self.null_as_string_after,
            max_depth: self.max_depth,
            max_columns: self.max_columns,
            topic_column: false,
            headers_column: false,
            overrides: self
                .overrides
                .iter()
                .filter_map(|(p, t)| parse_type(t).ok().map(|t| (p.clone(), t)))
                .collect(),
        }
    }
}

/// Parsed schema settings, shared by the trackers of a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaOptions {
    /// See [`SchemaConfig::detect_timestamps`].
    pub detect_timestamps: bool,
    /// See [`SchemaConfig::null_as_string_after`].
    pub null_as_string_after: Option<u64>,
    /// See [`SchemaConfig::max_depth`].
    pub max_depth: usize,
    /// See [`SchemaConfig::max_columns`].
    pub max_columns: usize,
    /// Forced types by dotted path.
    pub overrides: HashMap<String, Type>,
    /// Rows carry `_kafka_topic`, and a new table gets the column (the sink's
    /// `topic_column`).
    pub topic_column: bool,
    /// Rows carry `_kafka_headers`, and a new table gets the column (the sink's
    /// `headers_column`).
    pub headers_column: bool,
}

impl Default for SchemaOptions {
    fn default() -> Self {
        SchemaConfig::default().options()
    }
}

/// Why an override type name cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TypeNameError {
    /// `decimal(...)` without both precision and scale.
    #[error("{0:?}: write decimal(P,S)")]
    DecimalForm(String),
    /// The precision of a decimal is not a number.
    #[error("{text:?}: bad precision")]
    Precision {
        /// The type name.
        text: String,
        /// Why it is not a number.
        source: std::num::ParseIntError,
    },
    /// The scale of a decimal is not a number.
    #[error("{text:?}: bad scale")]
    Scale {
        /// The type name.
        text: String,
        /// Why it is not a number.
        source: std::num::ParseIntError,
    },
    /// A decimal Iceberg cannot hold.
    #[error("{0:?}: precision must be 1..=38 and scale at most the precision")]
    DecimalRange(String),
    /// The length of a `fixed[N]` is not a number.
    #[error("{text:?}: bad length")]
    Length {
        /// The type name.
        text: String,
        /// Why it is not a number.
        source: std::num::ParseIntError,
    },
    /// No such type.
    #[error(
        "unknown type {0:?} (boolean, int, long, float, double, decimal(P,S), date, time, timestamp, timestamptz, string, uuid, binary, fixed[N])"
    )]
    Unknown(String),
}

/// Parses an override type name: `long`, `decimal(18,2)`, `fixed[16]`, ...
pub fn parse_type(s: &str) -> Result<Type, TypeNameError> {
    let t = s.trim().to_ascii_lowercase();
    let p = match t.as_str() {
        "boolean" => PrimitiveType::Boolean,
        "int" => PrimitiveType::Int,
        "long" => PrimitiveType::Long,
        "float" => PrimitiveType::Float,
        "double" => PrimitiveType::Double,
        "date" => PrimitiveType::Date,
        "time" => PrimitiveType::Time,
        "timestamp" => PrimitiveType::Timestamp,
        "timestamptz" => PrimitiveType::Timestamptz,
        "string" => PrimitiveType::String,
        "uuid" => PrimitiveType::Uuid,
        "binary" => PrimitiveType::Binary,
        other => {
            if let Some(args) = other
                .strip_prefix("decimal(")
                .and_then(|r| r.strip_suffix(')'))
            {
                let (ps, ss) = args
                    .split_once(',')
                    .ok_or_else(|| TypeNameError::DecimalForm(s.to_string()))?;
                let precision: u32 =
                    ps.trim()
                        .parse()
                        .map_err(|source| TypeNameError::Precision {
                            text: s.to_string(),
                            source,
                        })?;
                let scale: u32 = ss.trim().parse().map_err(|source| TypeNameError::Scale {
                    text: s.to_string(),
                    source,
                })?;
                if !(1..=38).contains(&precision) || scale > precision {
                    return Err(TypeNameError::DecimalRange(s.to_string()));
                }
                PrimitiveType::Decimal { precision, scale }
            } else if let Some(n) = other
                .strip_prefix("fixed[")
                .and_then(|r| r.strip_suffix(']'))
            {
                let n: u64 = n.trim().parse().map_err(|source| TypeNameError::Length {
                    text: s.to_string(),
                    source,
                })?;
                PrimitiveType::Fixed(n)
            } else {
                return Err(TypeNameError::Unknown(s.to_string()));
            }
        }
    };
    Ok(Type::Primitive(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_types_parse_or_explain() {
        let ok = [
            ("decimal(18, 2)", "decimal(18, 2)"),
            ("DATE", "date"),
            ("uuid", "uuid"),
            ("fixed[16]", "fixed(16)"),
            ("timestamptz", "timestamptz"),
        ];
        for (text, name) in ok {
            assert_eq!(crate::schema::type_name(&parse_type(text).unwrap()), name);
        }
        assert!(
            parse_type("decimal(40,2)")
                .unwrap_err()
                .to_string()
                .contains("1..=38")
        );
        assert!(parse_type("decimal(5,6)").is_err());
        assert!(
            parse_type("varchar")
                .unwrap_err()
                .to_string()
                .contains("unknown type")
        );
        let config: SchemaConfig = toml::from_str(
            "on_incompatible = \"coerce\"\nnull_as_string_after = 0\noverrides = { a = \"int\", b = \"nope\" }",
        )
        .unwrap();
        let problems = config.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0].0, "overrides.b");
        assert_eq!(problems[1].0, "null_as_string_after");
        assert_eq!(config.options().overrides.len(), 1);
        assert!(toml::from_str::<SchemaConfig>("on_incompatible = \"ignore\"").is_err());
    }
}
