//! Upsert mode: one row per key.
//!
//! Strategy (the default every tested reader understands: PyIceberg, DuckDB, Spark):
//! - within one commit the last message per key wins; a tombstone (keyed by the message
//!   key) removes the key;
//! - the surviving rows are appended as new data files;
//! - the rows they replace (or that a tombstone deletes) in older files are removed with
//!   one **position-delete file** per commit, found through the [`KeyIndex`];
//! - both go into one snapshot (operation `overwrite`) through [`super::commit`], which
//!   requires the exact parent the deletes were computed against: if another writer
//!   changed the table's data meanwhile, the index is rebuilt and the deletes recomputed.
//!
//! Read cost: every delete file of the table is read by every scan until compaction
//! rewrites the data files; busy upsert tables need regular compaction (see docs/upsert.md).

mod deletes;
mod index;

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use iceberg::spec::{FormatVersion, NestedField, PrimitiveType, Schema, TableMetadata, Type};

pub use crate::record::key::{KeyHash, KeySpec, MESSAGE_KEY};
pub use deletes::write_position_deletes;
pub use index::{KeyIndex, RebuildStats};

/// Name of the operation column of upsert tables (`insert` or `update`).
pub const OP_COLUMN: &str = "_op";

/// Errors of upsert mode.
#[derive(Debug, thiserror::Error)]
pub enum UpsertError {
    /// Reading or writing table files failed.
    #[error(transparent)]
    Iceberg(#[from] iceberg::Error),
    /// A Parquet file could not be read or written.
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow data could not be built.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// More live keys than `max_keys`.
    #[error(
        "the upsert index holds more than max_keys = {0} keys; raise `max_keys` (about 70 bytes of memory per key)"
    )]
    TooManyKeys(usize),
    /// A limit of the index format.
    #[error("too many {0} for the upsert index")]
    TooLarge(&'static str),
    /// The table or the key does not fit upsert mode.
    #[error("{0}")]
    Unsupported(String),
}

/// One commit's worth of upserts, after "last message per key wins".
#[derive(Debug, Default)]
pub struct Plan {
    /// Per buffered row: whether it is written.
    pub keep: Vec<bool>,
    /// The keys of the written rows, in row order.
    pub row_keys: Vec<KeyHash>,
    /// `insert` or `update` per written row.
    pub ops: Vec<&'static str>,
    /// Every key the commit touches (written or deleted).
    pub touched: Vec<KeyHash>,
}

impl Plan {
    /// Plans buffered rows with their `keys` (`live`: false for a tombstone) against
    /// the current index.
    pub fn new(keys: &[(KeyHash, bool)], index: &KeyIndex) -> Plan {
        let mut last: HashMap<KeyHash, usize, RandomState> =
            HashMap::with_capacity_and_hasher(keys.len(), RandomState::default());
        for (i, (k, _)) in keys.iter().enumerate() {
            last.insert(*k, i);
        }
        let mut plan = Plan {
            keep: Vec::with_capacity(keys.len()),
            row_keys: Vec::with_capacity(last.len()),
            ops: Vec::with_capacity(last.len()),
            touched: Vec::with_capacity(last.len()),
        };
        for (i, (key, live)) in keys.iter().enumerate() {
            let newest = last.get(key) == Some(&i);
            if newest {
                plan.touched.push(*key);
            }
            let keep = newest && *live;
            plan.keep.push(keep);
            if keep {
                plan.row_keys.push(*key);
                plan.ops.push(if index.get(key).is_some() {
                    "update"
                } else {
                    "insert"
                });
            }
        }
        plan
    }
}

/// The rows in older files that a commit touching `touched` keys replaces or deletes.
pub fn rows_to_delete(touched: &[KeyHash], index: &KeyIndex) -> Vec<(String, u64)> {
    touched
        .iter()
        .filter_map(|k| index.get(k).map(|(f, p)| (f.to_string(), p)))
        .collect()
}

/// Turns a new table's schema into an upsert table's: key columns required and set as
/// identifier fields, plus the `_op` column.
pub fn upsert_schema(schema: &Schema, spec: &KeySpec) -> Result<Schema, UpsertError> {
    let keys = spec.columns();
    let mut fields = Vec::new();
    let mut identifiers = Vec::new();
    for f in schema.as_struct().fields() {
        if keys.contains(&f.name.as_str()) {
            check_key_type(&f.name, &f.field_type)?;
            identifiers.push(f.id);
            let mut required = f.as_ref().clone();
            required.required = true;
            fields.push(Arc::new(required));
        } else {
            fields.push(f.clone());
        }
    }
    if let Some(missing) = keys.iter().find(|k| schema.field_by_name(k).is_none()) {
        return Err(UpsertError::Unsupported(format!(
            "key column `{missing}` is not among the records' fields"
        )));
    }
    if schema.field_by_name(OP_COLUMN).is_none() {
        // Above every id, nested ones (list elements, struct fields) included.
        fields.push(Arc::new(NestedField::optional(
            schema.highest_field_id() + 1,
            OP_COLUMN,
            Type::Primitive(PrimitiveType::String),
        )));
    }
    Ok(Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(identifiers)
        .build()?)
}

/// Checks that an existing table can be upserted with `spec`.
pub fn check_table(metadata: &TableMetadata, spec: &KeySpec) -> Result<(), UpsertError> {
    // v3 replaces position-delete files by deletion vectors, which iceberg-rust 0.10
    // cannot write yet; v1 has no delete files at all.
    if metadata.format_version() != FormatVersion::V2 {
        return Err(UpsertError::Unsupported(format!(
            "upsert mode writes position deletes, which need a format-version 2 table (this one is {})",
            metadata.format_version()
        )));
    }
    let schema = metadata.current_schema();
    for k in spec.columns() {
        let Some(f) = schema.field_by_name(k) else {
            return Err(UpsertError::Unsupported(format!(
                "key column `{k}` is not in the table"
            )));
        };
        check_key_type(k, &f.field_type)?;
    }
    Ok(())
}

fn check_key_type(name: &str, t: &Type) -> Result<(), UpsertError> {
    match t {
        Type::Primitive(PrimitiveType::Long | PrimitiveType::Int | PrimitiveType::String) => Ok(()),
        other => Err(UpsertError::Unsupported(format!(
            "key column `{name}` is {other}; upsert keys must be string, int or long"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_message_per_key_wins_and_tombstones_delete() {
        let mut index = KeyIndex::new(100);
        index.put(2, "old.parquet", 5).unwrap();
        index.put(3, "old.parquet", 6).unwrap();
        // Rows 0..5 with keys 1, 2, 1, 3 (tombstone), 4.
        let keys = [(1, true), (2, true), (1, true), (3, false), (4, true)];
        let plan = Plan::new(&keys, &index);
        assert_eq!(
            plan.keep,
            [false, true, true, false, true],
            "one row per key, the latest; key 3 deleted"
        );
        assert_eq!(plan.row_keys, [2, 1, 4]);
        assert_eq!(plan.ops, ["update", "insert", "insert"]);
        let mut deletes = rows_to_delete(&plan.touched, &index);
        deletes.sort();
        assert_eq!(
            deletes,
            [
                ("old.parquet".to_string(), 5),
                ("old.parquet".to_string(), 6)
            ]
        );
    }

    #[test]
    fn upsert_schema_marks_keys_required() {
        let schema = Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::optional(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "v",
                    Type::Primitive(PrimitiveType::Double),
                )),
                Arc::new(NestedField::optional(
                    3,
                    "tags",
                    Type::List(iceberg::spec::ListType::new(Arc::new(
                        NestedField::list_element(4, Type::Primitive(PrimitiveType::String), false),
                    ))),
                )),
            ])
            .build()
            .unwrap();
        let s = upsert_schema(&schema, &KeySpec::from_config(&["id".into()])).unwrap();
        assert!(s.field_by_name("id").unwrap().required);
        assert_eq!(s.identifier_field_ids().collect::<Vec<_>>(), [1]);
        assert_eq!(
            s.field_by_name(OP_COLUMN).unwrap().id,
            5,
            "above the list element's id too"
        );
        let e = upsert_schema(&schema, &KeySpec::from_config(&["v".into()])).unwrap_err();
        assert!(e.to_string().contains("string, int or long"), "{e}");
        let e = upsert_schema(&schema, &KeySpec::from_config(&["nope".into()])).unwrap_err();
        assert!(e.to_string().contains("not among"), "{e}");
    }
}
