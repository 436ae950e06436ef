//! Upsert mode: one row per key.
//!
//! Strategy (the default every tested reader understands: PyIceberg, DuckDB, Spark):
//! - within one commit the last message per key wins; a tombstone (keyed by the message
//!   key) removes the key;
//! - the surviving rows are appended as new data files;
//! - the rows they replace (or that a tombstone deletes) in older files are removed with
//!   one **position-delete file** per partition per commit (format v2), or one
//!   **deletion vector** per data file, all in one Puffin file per commit (format v3),
//!   found through the [`KeyIndex`];
//! - both go into one snapshot (operation `overwrite`; `delete` when the commit only
//!   deletes) through [`floe_iceberg::commit`], which requires the exact parent the
//!   deletes were computed against: if another writer changed the table's data
//!   meanwhile, the index is rebuilt and the deletes recomputed.
//!
//! Read cost: every delete file of the table is read by every scan until compaction
//! rewrites the data files; busy upsert tables need regular compaction (see docs/upsert.md).

mod index;

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use iceberg::spec::{FormatVersion, NestedField, PrimitiveType, Schema, TableMetadata, Type};

pub use crate::record::key::{KeyHash, KeySpec, MESSAGE_KEY};
pub use index::{FileInfo, IndexSettings, KeyIndex, RebuildStats};

use floe_iceberg::{dv, write_position_deletes};

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
    #[error("the upsert index holds more than max_keys = {0} keys; raise or remove `max_keys`")]
    TooManyKeys(u64),
    /// The key index's local files could not be read or written.
    #[error(
        "the upsert key index in {dir} failed: {source} (check `index_dir`: free space, permissions)"
    )]
    Dir {
        /// The index directory.
        dir: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The key index's temporary directory or files failed.
    #[error("the upsert key index failed: {0}")]
    Io(#[from] std::io::Error),
    /// A limit of the index format.
    #[error("too many {0} for the upsert index")]
    TooLarge(&'static str),
    /// The table or the key does not fit upsert mode.
    #[error("{0}")]
    Unsupported(String),
}

impl UpsertError {
    /// Whether the key index's files were found damaged (a checksum, a length or a file
    /// id that does not match): the index must be dropped and rebuilt from the table.
    pub fn is_index_damage(&self) -> bool {
        match self {
            UpsertError::Dir { source, .. } | UpsertError::Io(source) => index::is_damage(source),
            _ => false,
        }
    }

    /// A failure of the index directory `dir`.
    pub fn dir(dir: &std::path::Path, source: std::io::Error) -> UpsertError {
        UpsertError::Dir {
            dir: dir.display().to_string(),
            source,
        }
    }
}

impl From<floe_iceberg::Error> for UpsertError {
    fn from(e: floe_iceberg::Error) -> UpsertError {
        match e {
            floe_iceberg::Error::Iceberg(e) => UpsertError::Iceberg(e),
            floe_iceberg::Error::Parquet(e) => UpsertError::Parquet(e),
            floe_iceberg::Error::Arrow(e) => UpsertError::Arrow(e),
            floe_iceberg::Error::Unsupported(m) => UpsertError::Unsupported(m),
            other => UpsertError::Unsupported(other.to_string()),
        }
    }
}

/// One chunk's worth of upserts, after "last message per key wins".
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
    /// Plans buffered rows with their `keys` (`live`: false for a tombstone); `exists`
    /// says of each key written whether it has a live row already (its new row is an
    /// `update`), asked once for all of them so the lookups can run together.
    pub fn new(
        keys: &[(KeyHash, bool)],
        exists: impl FnOnce(&[KeyHash]) -> Result<Vec<bool>, UpsertError>,
    ) -> Result<Plan, UpsertError> {
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
            }
        }
        let existing = exists(&plan.row_keys)?;
        debug_assert_eq!(existing.len(), plan.row_keys.len(), "one answer per key");
        plan.ops = existing
            .into_iter()
            .map(|e| if e { "update" } else { "insert" })
            .collect();
        Ok(plan)
    }
}

/// The rows of one data file a commit deletes: a file of the table (with its live
/// deletion vector, which a new one replaces on format v3) or one this commit adds.
#[derive(Debug, Clone)]
pub struct DeleteTarget {
    /// The data file's path.
    pub path: Arc<str>,
    /// Its partition spec id.
    pub spec_id: i32,
    /// Its partition tuple (a delete file for it carries the same).
    pub partition: iceberg::spec::Struct,
    /// Format v3: its live deletion vector.
    pub dv: Option<iceberg::spec::DataFile>,
    /// Positions to delete.
    pub positions: Vec<u64>,
}

/// The delete files of one upsert commit.
#[derive(Debug, Default)]
pub struct CommitDeletes {
    /// New delete files with their partition spec ids.
    pub files: Vec<(i32, iceberg::spec::DataFile)>,
    /// Format v3: the deletion vectors the new ones replace (removed by the commit).
    pub replaced: Vec<floe_iceberg::manifests::FileKey>,
    /// Format v3: per data file path, its new deletion vector.
    pub vectors: Vec<(Arc<str>, iceberg::spec::DataFile)>,
}

/// Writes the delete files removing the rows of `targets`: position-delete files, one per
/// partition (format v2), or deletion vectors merged with each data file's current one
/// (format v3).
pub async fn write_deletes(
    table: &iceberg::table::Table,
    name_prefix: &str,
    targets: Vec<DeleteTarget>,
) -> Result<CommitDeletes, UpsertError> {
    let mut out = CommitDeletes::default();
    let targets: Vec<DeleteTarget> = targets
        .into_iter()
        .filter(|t| !t.positions.is_empty())
        .collect();
    if targets.is_empty() {
        return Ok(out);
    }
    if table.metadata().format_version() >= FormatVersion::V3 {
        let mut vectors = Vec::with_capacity(targets.len());
        let mut paths = Vec::with_capacity(targets.len());
        for t in targets {
            let mut all: roaring::RoaringTreemap = t.positions.iter().copied().collect();
            if let Some(old) = &t.dv {
                all |= dv::read(table, old).await?;
                out.replaced.push(floe_iceberg::manifests::FileKey::of(old));
            }
            vectors.push(dv::Target {
                data_file: t.path.to_string(),
                spec_id: t.spec_id,
                partition: t.partition,
                positions: all,
            });
            paths.push(t.path);
        }
        let written = dv::write(table, name_prefix, vectors).await?;
        // `write` keeps the targets' order (none is empty: each has a position).
        for (path, (spec, file)) in paths.into_iter().zip(written) {
            out.vectors.push((path, file.clone()));
            out.files.push((spec, file));
        }
        return Ok(out);
    }
    // One position-delete file per partition (spec id and partition tuple).
    type Rows = Vec<(String, u64)>;
    let mut by_partition: Vec<((i32, iceberg::spec::Struct), Rows)> = Vec::new();
    for t in targets {
        let key = (t.spec_id, t.partition.clone());
        let rows = t.positions.into_iter().map(|p| (t.path.to_string(), p));
        match by_partition.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.extend(rows),
            None => by_partition.push((key, rows.collect())),
        }
    }
    for ((spec, partition), rows) in by_partition {
        let file = write_position_deletes(table, name_prefix, spec, partition, rows).await?;
        out.files.push((spec, file));
    }
    Ok(out)
}

/// What an upsert writer did since its last commit, in one generation of files (the
/// files one commit adds): where each key it wrote now lives (`None`: deleted by a
/// tombstone), and the rows of its own uncommitted files that later writes replaced.
/// Deletes of committed rows are found at commit time from the key index.
///
/// Rows are kept as (file number, position) in 8 bytes, file paths once each: an
/// interval's worth of keys is held until its commit.
#[derive(Debug, Default)]
pub struct Overlay {
    paths: Vec<Arc<str>>,
    path_ids: HashMap<Arc<str>, u32, RandomState>,
    /// Per key written: its newest row, packed, or [`Overlay::DELETED`].
    writes: HashMap<KeyHash, u64, RandomState>,
    /// Rows of uncommitted files replaced by a later write of the same key.
    superseded: Vec<u64>,
}

type RowPlace = crate::sink::stream::RowPlace;

impl Overlay {
    const DELETED: u64 = u64::MAX;

    fn pack(&mut self, place: &RowPlace) -> Result<u64, UpsertError> {
        let id = match self.path_ids.get(&place.0) {
            Some(id) => *id,
            None => {
                let id = self.paths.len() as u32;
                self.paths.push(place.0.clone());
                self.path_ids.insert(place.0.clone(), id);
                id
            }
        };
        let pos =
            u32::try_from(place.1).map_err(|_| UpsertError::TooLarge("rows in one data file"))?;
        Ok((u64::from(id) << 32) | u64::from(pos))
    }

    fn unpack(&self, row: u64) -> RowPlace {
        (self.paths[(row >> 32) as usize].clone(), row & 0xffff_ffff)
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Keys written.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Bytes of memory held, about.
    pub fn memory(&self) -> usize {
        self.writes.capacity() * 26 + self.superseded.capacity() * 8 + self.paths.len() * 128
    }

    /// `key`'s newest row here: `Some(None)` for a tombstone, `None` when not written.
    pub fn get(&self, key: &KeyHash) -> Option<Option<RowPlace>> {
        self.writes
            .get(key)
            .map(|row| (*row != Self::DELETED).then(|| self.unpack(*row)))
    }

    /// Records `key`'s newest row (`None`: deleted).
    pub fn insert(&mut self, key: KeyHash, row: Option<&RowPlace>) -> Result<(), UpsertError> {
        let packed = match row {
            Some(place) => self.pack(place)?,
            None => Self::DELETED,
        };
        self.writes.insert(key, packed);
        Ok(())
    }

    /// Records that a row of an uncommitted file was replaced.
    pub fn supersede(&mut self, place: &RowPlace) -> Result<(), UpsertError> {
        let packed = self.pack(place)?;
        self.superseded.push(packed);
        Ok(())
    }

    /// Every key written, with its newest row (`None`: deleted).
    pub fn writes(&self) -> impl Iterator<Item = (&KeyHash, Option<RowPlace>)> {
        self.writes
            .iter()
            .map(|(k, row)| (k, (*row != Self::DELETED).then(|| self.unpack(*row))))
    }

    /// The rows of uncommitted files that later writes replaced.
    pub fn superseded(&self) -> impl Iterator<Item = RowPlace> + '_ {
        self.superseded.iter().map(|row| self.unpack(*row))
    }
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
    // v2: position-delete files; v3: deletion vectors; v1 has no delete files at all.
    if metadata.format_version() == FormatVersion::V1 {
        return Err(UpsertError::Unsupported(
            "upsert mode writes delete files, which need a format-version 2 or 3 table (this one is v1)".to_string(),
        ));
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
        let mut index = KeyIndex::new(IndexSettings::temporary(1 << 20)).unwrap();
        let old = index.register_file("old.parquet", 0, &iceberg::spec::Struct::empty());
        index.put(2, old, 5).unwrap();
        index.put(3, old, 6).unwrap();
        // Rows 0..5 with keys 1, 2, 1, 3 (tombstone), 4.
        let keys = [(1, true), (2, true), (1, true), (3, false), (4, true)];
        let plan = Plan::new(&keys, |keys| {
            Ok(index.get_many(keys)?.iter().map(Option::is_some).collect())
        })
        .unwrap();
        assert_eq!(
            plan.keep,
            [false, true, true, false, true],
            "one row per key, the latest; key 3 deleted"
        );
        assert_eq!(plan.row_keys, [2, 1, 4]);
        assert_eq!(plan.ops, ["update", "insert", "insert"]);
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
