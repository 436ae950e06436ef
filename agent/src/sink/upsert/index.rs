//! Where each live key's row is: key digest -> (data file, row position).
//!
//! Position deletes need the exact row an update replaces. The index is rebuilt from the
//! table when a pipeline starts (or when another writer changed the table's data): read the
//! key columns of every live data file, drop the rows named by position-delete files and
//! deletion vectors, keep the rest. After each commit it is updated with the rows the
//! commit wrote and removed.
//!
//! Memory: one hash-map entry of 16 + 8 bytes per live key (71 bytes resident measured at
//! 1M keys, with the map's spare capacity), plus per data file its path, partition tuple
//! and (format v3) the entry of its deletion vector. `max_keys` bounds it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::ArrayRef;
use foldhash::fast::RandomState;
use iceberg::spec::{DataContentType, DataFile, DataFileFormat, FormatVersion, Struct};
use iceberg::table::Table;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::UpsertError;
use crate::record::key::{KeyHash, KeySpec};
use floe_iceberg::{manifests, read_position_deletes};

/// A row of a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef {
    file: u32,
    pos: u32,
}

/// A data file the index points into.
#[derive(Debug, Clone)]
pub struct FileInfo {
    /// Its path.
    pub path: Arc<str>,
    /// The partition spec its partition tuple belongs to.
    pub spec_id: i32,
    /// Its partition tuple (a delete file for it must carry the same).
    pub partition: Struct,
    /// Format v3: its live deletion vector, which the next one for it replaces.
    pub dv: Option<DataFile>,
}

/// The key index of one table (see the module docs).
#[derive(Debug, Default)]
pub struct KeyIndex {
    files: Vec<FileInfo>,
    file_ids: HashMap<Arc<str>, u32, RandomState>,
    rows: HashMap<KeyHash, RowRef, RandomState>,
    max_keys: usize,
    /// The table snapshot the index reflects (`None`: the table had none).
    snapshot: Option<i64>,
}

/// What a rebuild found, for the log.
#[derive(Debug, Default, Clone, Copy)]
pub struct RebuildStats {
    /// Live data files read.
    pub data_files: usize,
    /// Position-delete files and deletion vectors read.
    pub delete_files: usize,
    /// Live keys.
    pub keys: usize,
    /// Live rows whose key was already live in another row (a table not written by
    /// Floe alone); the later row wins.
    pub duplicates: usize,
}

impl KeyIndex {
    /// An empty index holding at most `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        KeyIndex {
            max_keys,
            ..Default::default()
        }
    }

    /// Live keys.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Where `key`'s live row is: (file id, row position).
    pub fn get(&self, key: &KeyHash) -> Option<(u32, u64)> {
        self.rows.get(key).map(|r| (r.file, u64::from(r.pos)))
    }

    /// The data file with id `id`.
    pub fn file(&self, id: u32) -> &FileInfo {
        &self.files[id as usize]
    }

    /// Records a data file (once; later calls return the same id).
    pub fn register_file(&mut self, path: &str, spec_id: i32, partition: &Struct) -> u32 {
        if let Some(&id) = self.file_ids.get(path) {
            return id;
        }
        let path: Arc<str> = Arc::from(path);
        let id = self.files.len() as u32;
        self.files.push(FileInfo {
            path: path.clone(),
            spec_id,
            partition: partition.clone(),
            dv: None,
        });
        self.file_ids.insert(path, id);
        id
    }

    /// The id of a registered data file.
    pub fn file_id(&self, path: &str) -> Option<u32> {
        self.file_ids.get(path).copied()
    }

    /// Records the live deletion vector of data file `id`.
    pub fn set_dv(&mut self, id: u32, dv: DataFile) {
        self.files[id as usize].dv = Some(dv);
    }

    /// Records that `key` now lives at `pos` of data file `file` (a registered id).
    pub fn put(&mut self, key: KeyHash, file: u32, pos: u64) -> Result<(), UpsertError> {
        let pos = u32::try_from(pos).map_err(|_| UpsertError::TooLarge("rows in one data file"))?;
        self.rows.insert(key, RowRef { file, pos });
        if self.rows.len() > self.max_keys {
            return Err(UpsertError::TooManyKeys(self.max_keys));
        }
        Ok(())
    }

    /// The table snapshot the index reflects.
    pub fn snapshot(&self) -> Option<i64> {
        self.snapshot
    }

    /// Marks the index as reflecting `snapshot` (after this writer's own commit).
    pub fn set_snapshot(&mut self, snapshot: Option<i64>) {
        self.snapshot = snapshot;
    }

    /// Learns what other writers committed after the snapshot the index reflects: the
    /// keys of the data files they added and the rows their position deletes removed.
    /// Returns false when that cannot be done incrementally (the snapshot left `main`,
    /// or a later snapshot rewrote or removed files, as compaction does): rebuild then.
    pub async fn catch_up(&mut self, table: &Table, spec: &KeySpec) -> Result<bool, UpsertError> {
        let metadata = table.metadata();
        let mut newer = Vec::new();
        let mut current = metadata.current_snapshot();
        loop {
            match current {
                Some(s) if Some(s.snapshot_id()) == self.snapshot => break,
                Some(s) => {
                    newer.push(s.clone());
                    current = s
                        .parent_snapshot_id()
                        .and_then(|id| metadata.snapshot_by_id(id));
                }
                None if self.snapshot.is_none() => break,
                None => return Ok(false),
            }
        }
        newer.reverse();
        let key_ids = key_field_ids(table, spec)?;
        for snapshot in &newer {
            let summary = snapshot.summary();
            let count = |key: &str| {
                summary
                    .additional_properties
                    .get(key)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let rewrites = !matches!(
                summary.operation,
                iceberg::spec::Operation::Append | iceberg::spec::Operation::Overwrite
            ) || count("deleted-data-files") > 0
                || count("removed-delete-files") > 0
                || count("added-equality-deletes") > 0;
            if rewrites {
                return Ok(false);
            }
            let list = table.manifest_list_reader(snapshot).load().await?;
            for manifest_file in list.entries() {
                if manifest_file.added_snapshot_id != snapshot.snapshot_id() {
                    continue;
                }
                let manifest = manifest_file.load_manifest(table.file_io()).await?;
                for entry in manifest.entries() {
                    if entry.status() != iceberg::spec::ManifestStatus::Added {
                        continue;
                    }
                    if entry.file_format() != iceberg::spec::DataFileFormat::Parquet {
                        return Ok(false);
                    }
                    match entry.content_type() {
                        DataContentType::Data => {
                            let path = entry.file_path().to_string();
                            let file = self.register_file(
                                &path,
                                manifest_file.partition_spec_id,
                                entry.data_file().partition(),
                            );
                            let keys = read_keys(table, &path, &key_ids).await?;
                            for (pos, key) in keys.into_iter().enumerate() {
                                if let Some(key) = key {
                                    self.put(key, file, pos as u64)?;
                                }
                            }
                        }
                        DataContentType::PositionDeletes => {
                            let mut deleted = HashMap::default();
                            read_position_deletes(table, entry.file_path(), &mut deleted).await?;
                            self.forget_deleted(table, &key_ids, deleted).await?;
                        }
                        DataContentType::EqualityDeletes => return Ok(false),
                    }
                }
            }
        }
        self.snapshot = metadata.current_snapshot_id();
        Ok(true)
    }

    /// Drops the keys whose live row is among `deleted` (file -> positions).
    async fn forget_deleted(
        &mut self,
        table: &Table,
        key_ids: &[i32],
        deleted: HashMap<String, Vec<u64>, RandomState>,
    ) -> Result<(), UpsertError> {
        for (path, positions) in deleted {
            let Some(&file) = self.file_ids.get(path.as_str()) else {
                continue;
            };
            let keys = read_keys(table, &path, key_ids).await?;
            for pos in positions {
                let Some(Some(key)) = keys.get(pos as usize) else {
                    continue;
                };
                if self.rows.get(key)
                    == Some(&RowRef {
                        file,
                        pos: pos as u32,
                    })
                {
                    self.rows.remove(key);
                }
            }
        }
        Ok(())
    }

    /// Records that `key` has no live row.
    pub fn remove(&mut self, key: &KeyHash) {
        self.rows.remove(key);
    }

    /// Reads the table's current snapshot into a new index.
    pub async fn rebuild(
        table: &Table,
        spec: &KeySpec,
        max_keys: usize,
    ) -> Result<(KeyIndex, RebuildStats), UpsertError> {
        let mut index = KeyIndex::new(max_keys);
        index.snapshot = table.metadata().current_snapshot_id();
        let mut stats = RebuildStats::default();
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return Ok((index, stats));
        };
        let v3 = table.metadata().format_version() >= FormatVersion::V3;
        // Data files in data-sequence order, so a key written twice ends at its later row.
        let mut data_files: Vec<(i64, String, i32, Struct)> = Vec::new();
        let mut deleted: HashMap<String, Vec<u64>, RandomState> = HashMap::default();
        let mut dvs: HashMap<String, DataFile, RandomState> = HashMap::default();
        for live in manifests::live_files(table, snapshot).await? {
            let file = live.entry.data_file();
            match live.content() {
                DataContentType::Data => data_files.push((
                    live.sequence_number(),
                    live.path().to_string(),
                    live.manifest.partition_spec_id,
                    file.partition().clone(),
                )),
                DataContentType::PositionDeletes
                    if file.file_format() == DataFileFormat::Puffin =>
                {
                    stats.delete_files += 1;
                    let target = file.referenced_data_file().ok_or_else(|| {
                        UpsertError::Unsupported(format!(
                            "deletion vector in {} names no data file",
                            live.path()
                        ))
                    })?;
                    let positions = floe_iceberg::dv::read(table, file).await?;
                    deleted
                        .entry(target.clone())
                        .or_default()
                        .extend(positions.iter());
                    dvs.insert(target, file.clone());
                }
                DataContentType::PositionDeletes => {
                    if v3 {
                        return Err(UpsertError::Unsupported(
                            "this format-v3 table has position-delete files (from another writer or an upgrade from v2); Floe's upsert writes deletion vectors, which must include them: compact the table first (`floe maintain`)".to_string(),
                        ));
                    }
                    stats.delete_files += 1;
                    read_position_deletes(table, live.path(), &mut deleted).await?;
                }
                other => {
                    return Err(UpsertError::Unsupported(format!(
                        "the table has {other:?} files (from another writer); Floe's upsert index needs position deletes only"
                    )));
                }
            }
        }
        data_files.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let key_ids = key_field_ids(table, spec)?;
        for (_, path, spec_id, partition) in &data_files {
            stats.data_files += 1;
            let id = index.register_file(path, *spec_id, partition);
            if let Some(dv) = dvs.remove(path) {
                index.set_dv(id, dv);
            }
            let mut gone = deleted.remove(path).unwrap_or_default();
            gone.sort_unstable();
            let keys = read_keys(table, path, &key_ids).await?;
            for (pos, key) in keys.into_iter().enumerate() {
                let pos = pos as u64;
                let Some(key) = key else { continue };
                if gone.binary_search(&pos).is_ok() {
                    continue;
                }
                if index.rows.contains_key(&key) {
                    stats.duplicates += 1;
                }
                index.put(key, id, pos)?;
            }
        }
        stats.keys = index.len();
        Ok((index, stats))
    }
}

/// Field ids of the key columns in the table's current schema.
pub fn key_field_ids(table: &Table, spec: &KeySpec) -> Result<Vec<i32>, UpsertError> {
    let schema = table.metadata().current_schema();
    spec.columns()
        .into_iter()
        .map(|name| {
            schema.field_by_name(name).map(|f| f.id).ok_or_else(|| {
                UpsertError::Unsupported(format!("key column `{name}` is not in the table"))
            })
        })
        .collect()
}

/// Key digests of every row of a data file, by position.
async fn read_keys(
    table: &Table,
    path: &str,
    key_ids: &[i32],
) -> Result<Vec<Option<KeyHash>>, UpsertError> {
    let bytes = table.file_io().new_input(path)?.read().await?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let roots = builder.parquet_schema().root_schema().get_fields();
    let mut order = Vec::with_capacity(key_ids.len());
    for id in key_ids {
        let root = roots
            .iter()
            .position(|f| f.get_basic_info().has_id() && f.get_basic_info().id() == *id)
            .ok_or_else(|| {
                UpsertError::Unsupported(format!(
                    "data file {path} has no column with field id {id}"
                ))
            })?;
        order.push(root);
    }
    let mut sorted = order.clone();
    sorted.sort_unstable();
    let mask = ProjectionMask::roots(builder.parquet_schema(), sorted.iter().copied());
    let reader = builder.with_projection(mask).build()?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        // Projected columns come in file order; put them back in key order.
        let columns: Vec<ArrayRef> = order
            .iter()
            .map(|root| {
                let i = sorted.iter().position(|r| r == root).unwrap_or_default();
                batch.column(i).clone()
            })
            .collect();
        out.extend(KeySpec::of_columns(&columns).map_err(UpsertError::Unsupported)?);
    }
    Ok(out)
}
