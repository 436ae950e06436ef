//! Partitioned tables: the partition spec of tables Floe creates, and the check that
//! Floe can write a table's default spec.
//!
//! `partition_by = ["day(event_time)", "bucket(16, user_id)", "_kafka_partition"]` in
//! `[pipelines.sink]` gives the spec of a table the agent creates; a table that exists
//! is written with its own default spec, whatever the config says.
//!
//! Forms (the source column is a top-level or nested column, dots separating levels;
//! the partition field is named like Iceberg's Java API names it):
//!
//! | config | transform | partition field |
//! |---|---|---|
//! | `col` or `identity(col)` | identity | `col` |
//! | `year(col)` / `years(col)` | year | `col_year` |
//! | `month(col)` / `months(col)` | month | `col_month` |
//! | `day(col)` / `days(col)` | day | `col_day` |
//! | `hour(col)` / `hours(col)` | hour | `col_hour` |
//! | `bucket(N, col)` or `bucket[N](col)` | bucket\[N\] | `col_bucket` |
//! | `truncate(W, col)` or `truncate[W](col)` | truncate\[W\] | `col_trunc` |

use iceberg::spec::{PartitionSpec, Schema, TableMetadata, Transform, Type, UnboundPartitionSpec};

/// Why a `partition_by` entry cannot be read, or a partition spec cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// The entry is none of the forms.
    #[error(
        "cannot read partition field {0:?}: write a column (`region`), \
         year(col), month(col), day(col), hour(col), bucket(N, col) or truncate(W, col)"
    )]
    Unreadable(String),
    /// `bucket` or `truncate` without its number.
    #[error("{transform}: the {what} is missing in {text:?}")]
    MissingNumber {
        /// The transform as written.
        transform: String,
        /// What the number is (`number of buckets`, `width`).
        what: &'static str,
        /// The entry.
        text: String,
    },
    /// `bucket` or `truncate` with a number that is not a positive integer.
    #[error("{transform}: the {what} must be a positive integer in {text:?}")]
    BadNumber {
        /// The transform as written.
        transform: String,
        /// What the number is (`number of buckets`, `width`).
        what: &'static str,
        /// The entry.
        text: String,
    },
    /// The source column is not a column of the records.
    #[error("partition column `{0}` is not among the records' columns")]
    NoSuchColumn(String),
    /// The transform does not apply to the column's type.
    #[error(
        "partition {transform}({column}) cannot apply to `{column}`, which is {column_type}{hint}"
    )]
    CannotApply {
        /// The transform.
        transform: Transform,
        /// The source column.
        column: String,
        /// Its type.
        column_type: Box<Type>,
        /// What the transform needs instead.
        hint: &'static str,
        /// Iceberg's refusal.
        #[source]
        source: Box<iceberg::Error>,
    },
    /// Iceberg refused the spec.
    #[error("{}", .0.message())]
    Spec(#[source] Box<iceberg::Error>),
    /// A field of the table's spec uses a transform Floe does not know.
    #[error("partition field {0:?} uses a transform Floe does not know")]
    UnknownTransform(String),
    /// A field of the table's spec reads a column the schema does not have.
    #[error("partition field {field:?} reads {column}, which is not in the current schema")]
    SourceMissing {
        /// The partition field.
        field: String,
        /// Its source column (or field id).
        column: String,
    },
    /// A field of the table's spec reads a column inside a list or map.
    #[error(
        "partition field {field:?} reads `{column}`, which is not a primitive column reachable through structs (inside a list or map?)"
    )]
    SourceUnreachable {
        /// The partition field.
        field: String,
        /// Its source column.
        column: String,
    },
    /// A field's transform does not apply to its source column's type.
    #[error("partition field {field:?}: {}", .source.message())]
    Transform {
        /// The partition field.
        field: String,
        /// Iceberg's refusal.
        source: Box<iceberg::Error>,
    },
    /// Partition values cannot be computed for the spec.
    #[error("cannot compute partition values: {}", .0.message())]
    Values(#[source] Box<iceberg::Error>),
    /// The table's default spec cannot be written.
    #[error("the table's partition spec cannot be written by Floe: {0}")]
    Table(#[source] Box<PartitionError>),
}

/// One entry of `partition_by`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    /// Source column, dots separating nested levels.
    pub column: String,
    /// The transform.
    pub transform: Transform,
}

impl PartitionField {
    /// Parses one `partition_by` entry.
    pub fn parse(text: &str) -> Result<PartitionField, PartitionError> {
        let t = text.trim();
        let usage = || PartitionError::Unreadable(text.to_string());
        let Some(open) = t.find('(') else {
            return column(t)
                .map(|c| PartitionField {
                    column: c,
                    transform: Transform::Identity,
                })
                .ok_or_else(usage);
        };
        let inner = t[open + 1..].strip_suffix(')').ok_or_else(usage)?.trim();
        let head = t[..open].trim();
        // `bucket[16](col)`: the parameter in brackets.
        let (name, bracket) = match head.split_once('[') {
            Some((n, rest)) => (
                n.trim(),
                Some(rest.strip_suffix(']').ok_or_else(usage)?.trim()),
            ),
            None => (head, None),
        };
        let (param, col) = match (bracket, inner.split_once(',')) {
            (Some(p), None) => (Some(p), inner),
            (None, Some((p, c))) => (Some(p.trim()), c.trim()),
            (None, None) => (None, inner),
            (Some(_), Some(_)) => return Err(usage()),
        };
        let col = column(col).ok_or_else(usage)?;
        let number = |what: &'static str| -> Result<u32, PartitionError> {
            let p = param.ok_or_else(|| PartitionError::MissingNumber {
                transform: name.to_string(),
                what,
                text: text.to_string(),
            })?;
            match p.parse::<u32>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(PartitionError::BadNumber {
                    transform: name.to_string(),
                    what,
                    text: text.to_string(),
                }),
            }
        };
        let transform = match name.to_ascii_lowercase().as_str() {
            "identity" if param.is_none() => Transform::Identity,
            "year" | "years" if param.is_none() => Transform::Year,
            "month" | "months" if param.is_none() => Transform::Month,
            "day" | "days" if param.is_none() => Transform::Day,
            "hour" | "hours" if param.is_none() => Transform::Hour,
            "bucket" => Transform::Bucket(number("number of buckets")?),
            "truncate" => Transform::Truncate(number("width")?),
            _ => return Err(usage()),
        };
        Ok(PartitionField {
            column: col,
            transform,
        })
    }

    /// The partition field's name.
    pub fn name(&self) -> String {
        let c = &self.column;
        match self.transform {
            Transform::Identity => c.clone(),
            Transform::Year => format!("{c}_year"),
            Transform::Month => format!("{c}_month"),
            Transform::Day => format!("{c}_day"),
            Transform::Hour => format!("{c}_hour"),
            Transform::Bucket(_) => format!("{c}_bucket"),
            Transform::Truncate(_) => format!("{c}_trunc"),
            Transform::Void | Transform::Unknown => format!("{c}_{}", self.transform),
        }
    }
}

fn column(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '$')
        });
    ok.then(|| s.to_string())
}

/// Parses every `partition_by` entry; problems as `(field, message)` pairs.
pub fn parse_all(entries: &[String]) -> (Vec<PartitionField>, Vec<(String, String)>) {
    let mut fields = Vec::new();
    let mut problems = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        match PartitionField::parse(e) {
            Ok(f) => {
                if fields.iter().any(|g: &PartitionField| g.name() == f.name()) {
                    problems.push((
                        format!("partition_by[{i}]"),
                        format!("{e:?} repeats partition field {:?}", f.name()),
                    ));
                }
                fields.push(f);
            }
            Err(m) => problems.push((format!("partition_by[{i}]"), m.to_string())),
        }
    }
    (fields, problems)
}

/// The partition spec of a new table with `schema`.
pub fn new_table_spec(
    fields: &[PartitionField],
    schema: &Schema,
) -> Result<UnboundPartitionSpec, PartitionError> {
    let mut builder = UnboundPartitionSpec::builder().with_spec_id(0);
    for f in fields {
        let Some(source) = schema.field_by_name(&f.column) else {
            return Err(PartitionError::NoSuchColumn(f.column.clone()));
        };
        f.transform
            .result_type(&source.field_type)
            .map_err(|e| PartitionError::CannotApply {
                transform: f.transform,
                column: f.column.clone(),
                column_type: source.field_type.clone(),
                hint: hint(&f.transform),
                source: Box::new(e),
            })?;
        builder = builder
            .add_partition_field(source.id, f.name(), f.transform)
            .map_err(|e| PartitionError::Spec(Box::new(e)))?;
    }
    let spec = builder.build();
    // Bind once to catch what the builder does not check (a column inside a list).
    let bound = spec
        .clone()
        .bind(std::sync::Arc::new(schema.clone()))
        .map_err(|e| PartitionError::Spec(Box::new(e)))?;
    check_spec(&bound, schema)?;
    Ok(spec)
}

fn hint(t: &Transform) -> &'static str {
    match t {
        Transform::Year | Transform::Month | Transform::Day | Transform::Hour => {
            " (it needs a date or timestamp column: set `[pipelines.schema] overrides = { col = \"timestamptz\" }` if the values are text)"
        }
        Transform::Truncate(_) => " (it needs an int, long, decimal, string or binary column)",
        _ => "",
    }
}

/// Checks that Floe can compute `spec`'s partition values from rows of `schema`.
pub fn check_spec(spec: &PartitionSpec, schema: &Schema) -> Result<(), PartitionError> {
    for f in spec.fields() {
        let name = schema
            .name_by_field_id(f.source_id)
            .map(str::to_string)
            .unwrap_or_else(|| format!("field id {}", f.source_id));
        if matches!(f.transform, Transform::Unknown) {
            return Err(PartitionError::UnknownTransform(f.name.clone()));
        }
        if matches!(f.transform, Transform::Void) {
            continue;
        }
        let Some(source) = schema.field_by_id(f.source_id) else {
            return Err(PartitionError::SourceMissing {
                field: f.name.clone(),
                column: name,
            });
        };
        if schema.accessor_by_field_id(f.source_id).is_none() {
            return Err(PartitionError::SourceUnreachable {
                field: f.name.clone(),
                column: name,
            });
        }
        f.transform
            .result_type(&source.field_type)
            .map_err(|e| PartitionError::Transform {
                field: f.name.clone(),
                source: Box::new(e),
            })?;
    }
    iceberg::arrow::PartitionValueCalculator::try_new(spec, schema)
        .map(|_| ())
        .or_else(|e| {
            if spec.is_unpartitioned() {
                Ok(())
            } else {
                Err(PartitionError::Values(Box::new(e)))
            }
        })
}

/// Checks that Floe can write `metadata`'s default partition spec (at start, so a table
/// it cannot write fails with a clear error instead of a bad manifest).
pub fn check_table(metadata: &TableMetadata) -> Result<(), PartitionError> {
    check_spec(metadata.default_partition_spec(), metadata.current_schema())
        .map_err(|e| PartitionError::Table(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, StructType, Type};

    use super::*;

    fn schema() -> Schema {
        Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    1,
                    "_kafka_partition",
                    Type::Primitive(PrimitiveType::Int),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "ts",
                    Type::Primitive(PrimitiveType::Timestamptz),
                )),
                Arc::new(NestedField::optional(
                    3,
                    "user",
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::optional(
                    4,
                    "address",
                    Type::Struct(StructType::new(vec![Arc::new(NestedField::optional(
                        5,
                        "city",
                        Type::Primitive(PrimitiveType::String),
                    ))])),
                )),
                Arc::new(NestedField::optional(
                    6,
                    "tags",
                    Type::List(iceberg::spec::ListType::new(Arc::new(
                        NestedField::list_element(7, Type::Primitive(PrimitiveType::String), false),
                    ))),
                )),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn every_form_parses() {
        let cases = [
            ("region", Transform::Identity, "region"),
            ("identity(a.b)", Transform::Identity, "a.b"),
            ("day(ts)", Transform::Day, "ts_day"),
            ("days(ts)", Transform::Day, "ts_day"),
            ("hour( ts )", Transform::Hour, "ts_hour"),
            ("years(ts)", Transform::Year, "ts_year"),
            ("month(ts)", Transform::Month, "ts_month"),
            ("bucket(16, user)", Transform::Bucket(16), "user_bucket"),
            ("bucket[8](user)", Transform::Bucket(8), "user_bucket"),
            ("truncate(4, user)", Transform::Truncate(4), "user_trunc"),
            (
                "truncate[10](_kafka_offset)",
                Transform::Truncate(10),
                "_kafka_offset_trunc",
            ),
        ];
        for (text, transform, name) in cases {
            let f = PartitionField::parse(text).unwrap();
            assert_eq!(f.transform, transform, "{text}");
            assert_eq!(f.name(), name, "{text}");
        }
        for bad in [
            "",
            "day()",
            "bucket(user)",
            "bucket(0, user)",
            "week(ts)",
            "day(ts",
            "a..b",
        ] {
            assert!(
                PartitionField::parse(bad).is_err(),
                "{bad:?} must not parse"
            );
        }
        let (_, problems) = parse_all(&["day(ts)".into(), "days(ts)".into()]);
        assert_eq!(problems.len(), 1, "the same field twice");
    }

    #[test]
    fn specs_for_new_tables_are_checked_against_the_columns() {
        let s = schema();
        let fields: Vec<_> = [
            "day(ts)",
            "bucket(4, user)",
            "_kafka_partition",
            "address.city",
        ]
        .iter()
        .map(|t| PartitionField::parse(t).unwrap())
        .collect();
        let spec = new_table_spec(&fields, &s).unwrap();
        assert_eq!(spec.fields().len(), 4);
        let e = new_table_spec(&[PartitionField::parse("day(user)").unwrap()], &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("date or timestamp"), "{e}");
        let e = new_table_spec(&[PartitionField::parse("missing").unwrap()], &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not among"), "{e}");
        let e = new_table_spec(&[PartitionField::parse("tags.element").unwrap()], &s);
        assert!(e.is_err(), "a column inside a list cannot partition");
    }
}
