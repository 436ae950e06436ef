//! Where each live key's row is: key digest -> (data file, row position).
//!
//! Position deletes need the exact row an update replaces. The index learns the table's
//! rows when a pipeline starts and after each commit:
//!
//! - It lives in a [`KeyStore`]: a memory table bounded by `index_memory`, spilled to
//!   sorted runs on local disk (`index_dir`), so memory does not grow with the key count.
//! - It is persisted there with the table snapshot it reflects. At start it is opened
//!   from disk when that snapshot is still an ancestor of the table's current one, and
//!   catches up with what was committed since (this agent's last commits before a crash,
//!   other writers); only otherwise is it rebuilt by reading the key columns of every
//!   live data file (minus the rows of position deletes and deletion vectors).
//! - Catching up reads only the files of the newer snapshots: the keys of added data
//!   files, the rows their deletes remove, and the rows of data files they removed
//!   (compaction rewrites, another engine's copy-on-write deletes).
//!
//! - A rebuild keeps no manifest until it has read every file: a start never opens a
//!   partial index (see [`store`] for what a manifest promises).
//! - A damaged run or manifest (a checksum that does not match, a row naming no file) is
//!   an error that [`UpsertError::is_index_damage`] recognises: the caller drops the
//!   index and rebuilds it.
//!
//! Memory besides the store: per live data file its path, partition tuple and (format
//! v3) the entry of its deletion vector. A file removed from the table (compaction,
//! another engine's rewrite) is forgotten once no key points into it.

mod bloom;
mod run;
mod store;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::ArrayRef;
use foldhash::fast::RandomState;
use futures::StreamExt;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, FormatVersion, ManifestStatus, Struct,
};
use iceberg::table::Table;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use super::UpsertError;
use crate::record::key::{KeyHash, KeySpec};
use floe_iceberg::{dv, manifests, read_position_deletes};
use store::{KeyStore, Manifest};

pub use run::is_damage;

/// Rows per batch when reading key columns.
const KEY_BATCH_ROWS: usize = 64 * 1024;
/// A file id no data file has (the high half of a packed tombstone).
const NO_FILE: u32 = u32::MAX;

/// How an index may use memory and disk (`[pipelines.sink]` settings).
#[derive(Debug, Clone)]
pub struct IndexSettings {
    /// Bytes of memory for the memory table, fences and filters (`index_memory`).
    pub memory: u64,
    /// Where the index of each table is kept (`<dir>/<table uuid>/`); `None`: a private
    /// temporary directory, removed when the index is dropped.
    pub dir: Option<PathBuf>,
    /// Most live keys allowed (`max_keys`); `None`: no bound.
    pub max_keys: Option<u64>,
}

impl IndexSettings {
    /// Settings for an index in a temporary directory.
    pub fn temporary(memory: u64) -> IndexSettings {
        IndexSettings {
            memory,
            dir: None,
            max_keys: None,
        }
    }
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

/// The directory an index lives in.
#[derive(Debug)]
enum Home {
    /// Persisted for the next start; the lock keeps other processes out.
    Kept { dir: PathBuf, _lock: File },
    /// Removed on drop.
    Temporary(tempfile::TempDir),
}

impl Home {
    fn dir(&self) -> &Path {
        match self {
            Home::Kept { dir, .. } => dir,
            Home::Temporary(t) => t.path(),
        }
    }
}

/// The key index of one table (see the module docs).
#[derive(Debug)]
pub struct KeyIndex {
    /// Data files by id (the high half of a packed row); ids are never reused.
    files: HashMap<u32, FileInfo, RandomState>,
    next_file: u32,
    file_ids: HashMap<Arc<str>, u32, RandomState>,
    /// While a rebuild reads the table: nothing is kept for the next start.
    rebuilding: bool,
    /// `None` only while a spill runs on a blocking thread.
    store: Option<KeyStore>,
    home: Home,
    settings: IndexSettings,
    /// The table snapshot the index reflects (`None`: the table had none).
    snapshot: Option<i64>,
    table_uuid: String,
    key_field_ids: Vec<i32>,
}

/// What opening an index did, for the log.
#[derive(Debug, Default, Clone, Copy)]
pub struct RebuildStats {
    /// Whether it was opened from disk (else rebuilt from the table).
    pub from_disk: bool,
    /// Newer snapshots learned incrementally.
    pub caught_up: usize,
    /// Live data files read.
    pub data_files: usize,
    /// Position-delete files and deletion vectors read.
    pub delete_files: usize,
    /// Live keys (about: see [`KeyIndex::len`]).
    pub keys: u64,
    /// Live rows whose key was already live in another row (a table not written by
    /// Floe alone); the later row wins. Counted among keys still in memory.
    pub duplicates: usize,
}

fn pack(file: u32, pos: u32) -> u64 {
    (u64::from(file) << 32) | u64::from(pos)
}

fn unpack(row: u64) -> (u32, u64) {
    ((row >> 32) as u32, row & 0xffff_ffff)
}

impl KeyIndex {
    /// An empty index in a temporary directory, not tied to a table (tests, benches).
    pub fn new(settings: IndexSettings) -> Result<KeyIndex, UpsertError> {
        let home = Home::Temporary(tempfile::Builder::new().prefix("floe-index-").tempdir()?);
        let store = KeyStore::new(home.dir(), settings.memory);
        Ok(KeyIndex {
            files: HashMap::default(),
            next_file: 0,
            file_ids: HashMap::default(),
            rebuilding: false,
            store: Some(store),
            home,
            settings,
            snapshot: None,
            table_uuid: String::new(),
            key_field_ids: Vec::new(),
        })
    }

    /// The directory for `table`'s index: its own under `settings.dir`, locked, or a
    /// temporary one (no `dir`, or another process holds it).
    fn home_for(table: &Table, settings: &IndexSettings) -> Result<Home, UpsertError> {
        if let Some(root) = &settings.dir {
            let dir = root.join(table.metadata().uuid().to_string());
            std::fs::create_dir_all(&dir).map_err(|e| UpsertError::dir(&dir, e))?;
            let lock = File::create(dir.join("LOCK")).map_err(|e| UpsertError::dir(&dir, e))?;
            match lock.try_lock() {
                Ok(()) => return Ok(Home::Kept { dir, _lock: lock }),
                Err(std::fs::TryLockError::WouldBlock) => {
                    tracing::warn!(dir = %dir.display(), "the upsert index directory is in use by another process: using a temporary one (set a separate index_dir per agent)");
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(UpsertError::dir(&dir, e)),
            }
        }
        Ok(Home::Temporary(
            tempfile::Builder::new().prefix("floe-index-").tempdir()?,
        ))
    }

    /// An empty index for `table` (created just now), replacing any kept one.
    pub fn empty(
        table: &Table,
        spec: &KeySpec,
        settings: &IndexSettings,
    ) -> Result<KeyIndex, UpsertError> {
        let home = Self::home_for(table, settings)?;
        clear_dir(home.dir())?;
        let store = KeyStore::new(home.dir(), settings.memory);
        Ok(KeyIndex {
            files: HashMap::default(),
            next_file: 0,
            file_ids: HashMap::default(),
            rebuilding: false,
            store: Some(store),
            home,
            settings: settings.clone(),
            snapshot: table.metadata().current_snapshot_id(),
            table_uuid: table.metadata().uuid().to_string(),
            key_field_ids: key_field_ids(table, spec)?,
        })
    }

    /// The index of `table`'s current snapshot: the kept one caught up, or rebuilt.
    pub async fn open(
        table: &Table,
        spec: &KeySpec,
        settings: &IndexSettings,
    ) -> Result<(KeyIndex, RebuildStats), UpsertError> {
        let home = Self::home_for(table, settings)?;
        let key_ids = key_field_ids(table, spec)?;
        let kept = match KeyStore::open(home.dir(), settings.memory) {
            Ok(kept) => kept,
            Err(e) => {
                tracing::warn!(dir = %home.dir().display(), error = %e, "the kept upsert index cannot be read or is damaged: rebuilding it from the table");
                None
            }
        };
        if let Some((store, manifest)) = kept
            && manifest.table_uuid == table.metadata().uuid().to_string()
            && manifest.key_field_ids == key_ids
            && is_ancestor(table, manifest.snapshot)
        {
            let mut index = KeyIndex {
                files: HashMap::default(),
                next_file: manifest.next_file,
                file_ids: HashMap::default(),
                rebuilding: false,
                store: Some(store),
                home,
                settings: settings.clone(),
                snapshot: manifest.snapshot,
                table_uuid: manifest.table_uuid.clone(),
                key_field_ids: key_ids,
            };
            index.restore_files(table, &manifest).await?;
            let newer = index.newer_snapshots(table).map_or(0, |s| s.len());
            let caught_up = match index.catch_up(table, spec).await {
                Err(e) if e.is_index_damage() => {
                    tracing::warn!(dir = %index.home.dir().display(), error = %e, "the kept upsert index is damaged: rebuilding it from the table");
                    false
                }
                other => other?,
            };
            if caught_up {
                let stats = RebuildStats {
                    from_disk: true,
                    caught_up: newer,
                    keys: index.len(),
                    ..Default::default()
                };
                return Ok((index, stats));
            }
            let home = index.home;
            return Self::rebuild_in(home, table, spec, settings).await;
        }
        Self::rebuild_in(home, table, spec, settings).await
    }

    /// Registers the files a kept index names, with their partition tuples and
    /// deletion vectors as of the snapshot it reflects.
    async fn restore_files(
        &mut self,
        table: &Table,
        manifest: &Manifest,
    ) -> Result<(), UpsertError> {
        for (&id, path) in &manifest.files {
            let path: Arc<str> = Arc::from(path.as_str());
            self.file_ids.insert(path.clone(), id);
            self.files.insert(
                id,
                FileInfo {
                    path,
                    spec_id: 0,
                    partition: Struct::empty(),
                    dv: None,
                },
            );
        }
        let Some(snapshot) = manifest
            .snapshot
            .and_then(|id| table.metadata().snapshot_by_id(id))
        else {
            return Ok(());
        };
        for live in manifests::live_files(table, snapshot).await? {
            let file = live.entry.data_file();
            match live.content() {
                DataContentType::Data => {
                    if let Some(info) = self
                        .file_ids
                        .get(live.path())
                        .and_then(|id| self.files.get_mut(id))
                    {
                        info.spec_id = live.manifest.partition_spec_id;
                        info.partition = file.partition().clone();
                    }
                }
                DataContentType::PositionDeletes
                    if file.file_format() == DataFileFormat::Puffin =>
                {
                    if let Some(info) = file
                        .referenced_data_file()
                        .and_then(|target| self.file_ids.get(target.as_str()))
                        .and_then(|id| self.files.get_mut(id))
                    {
                        info.dv = Some(file.clone());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Reads the table's current snapshot into a new index (replacing a kept one).
    pub async fn rebuild(
        table: &Table,
        spec: &KeySpec,
        settings: &IndexSettings,
    ) -> Result<(KeyIndex, RebuildStats), UpsertError> {
        let home = Self::home_for(table, settings)?;
        Self::rebuild_in(home, table, spec, settings).await
    }

    /// Reads the table into an empty index in `home`. Until every file is read the
    /// directory holds no manifest, so a start after a crash (or a retry after an error)
    /// rebuilds again instead of opening a partial index; at the end it is persisted.
    async fn rebuild_in(
        home: Home,
        table: &Table,
        spec: &KeySpec,
        settings: &IndexSettings,
    ) -> Result<(KeyIndex, RebuildStats), UpsertError> {
        clear_dir(home.dir())?;
        let store = KeyStore::new(home.dir(), settings.memory);
        let mut index = KeyIndex {
            files: HashMap::default(),
            next_file: 0,
            file_ids: HashMap::default(),
            rebuilding: true,
            store: Some(store),
            home,
            settings: settings.clone(),
            snapshot: table.metadata().current_snapshot_id(),
            table_uuid: table.metadata().uuid().to_string(),
            key_field_ids: key_field_ids(table, spec)?,
        };
        let mut stats = RebuildStats::default();
        let Some(snapshot) = table.metadata().current_snapshot() else {
            index.rebuilding = false;
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
                    let positions = dv::read(table, file).await?;
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
        let key_ids = index.key_field_ids.clone();
        for (_, path, spec_id, partition) in &data_files {
            stats.data_files += 1;
            let id = index.register_file(path, *spec_id, partition);
            if let Some(dv) = dvs.remove(path) {
                index.set_dv(id, dv);
            }
            let mut gone = deleted.remove(path).unwrap_or_default();
            gone.sort_unstable();
            let store = index.store.as_mut().expect("store");
            let mut duplicates = 0;
            scan_keys(table, path, &key_ids, |pos, key| {
                if gone.binary_search(&pos).is_err() {
                    if store.in_memory(key) {
                        duplicates += 1;
                    }
                    store.put(key, pack(id, row_pos(pos)?));
                }
                Ok(())
            })
            .await?;
            stats.duplicates += duplicates;
            index.check_bound()?;
            index.maintain().await?;
            if index.store().runs() > 0 {
                crate::failpoint::hit(crate::failpoint::INDEX_REBUILDING);
            }
        }
        index.rebuilding = false;
        // Kept only when it spilled: a rebuild small enough for memory is quick to redo.
        if index.store().runs() > 0 {
            index.persist().await?;
        }
        stats.keys = index.len();
        Ok((index, stats))
    }

    fn store(&self) -> &KeyStore {
        self.store.as_ref().expect("key store")
    }

    fn store_mut(&mut self) -> &mut KeyStore {
        self.store.as_mut().expect("key store")
    }

    /// Live keys, about (a key updated since the last merge of the runs holding it
    /// counts twice).
    pub fn len(&self) -> u64 {
        self.store().approx_len()
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the index holds (its store; file paths not counted).
    pub fn memory(&self) -> usize {
        self.store().memory()
    }

    /// Where `key`'s live row is: (file id, row position).
    pub fn get(&self, key: &KeyHash) -> Result<Option<(u32, u64)>, UpsertError> {
        Ok(self.store().get(*key)?.map(unpack))
    }

    /// [`KeyIndex::get`] of each of `keys`, in order (big batches on several threads).
    pub fn get_many(&self, keys: &[KeyHash]) -> Result<Vec<Option<(u32, u64)>>, UpsertError> {
        let rows = self.store().get_many(keys)?;
        Ok(rows.into_iter().map(|row| row.map(unpack)).collect())
    }

    /// The data file with id `id`: an error (damage) when the index knows no such file,
    /// which only a damaged run can point to.
    pub fn file(&self, id: u32) -> Result<&FileInfo, UpsertError> {
        self.files.get(&id).ok_or_else(|| {
            UpsertError::dir(
                self.home.dir(),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a key points into data file {id}, which the index does not know"),
                ),
            )
        })
    }

    /// Data files the index knows.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Records a data file (once; later calls return the same id).
    pub fn register_file(&mut self, path: &str, spec_id: i32, partition: &Struct) -> u32 {
        if let Some(&id) = self.file_ids.get(path) {
            return id;
        }
        let path: Arc<str> = Arc::from(path);
        let id = self.next_file;
        self.next_file += 1;
        self.files.insert(
            id,
            FileInfo {
                path: path.clone(),
                spec_id,
                partition: partition.clone(),
                dv: None,
            },
        );
        self.file_ids.insert(path, id);
        id
    }

    /// Forgets data file `id` (removed from the table, no key points into it).
    fn unregister_file(&mut self, id: u32) {
        if let Some(info) = self.files.remove(&id) {
            self.file_ids.remove(&info.path);
        }
    }

    /// The id of a registered data file.
    pub fn file_id(&self, path: &str) -> Option<u32> {
        self.file_ids.get(path).copied()
    }

    /// Records the live deletion vector of data file `id`.
    pub fn set_dv(&mut self, id: u32, dv: DataFile) {
        if let Some(info) = self.files.get_mut(&id) {
            info.dv = Some(dv);
        }
    }

    /// Records that `key` now lives at `pos` of data file `file` (a registered id).
    pub fn put(&mut self, key: KeyHash, file: u32, pos: u64) -> Result<(), UpsertError> {
        if file == NO_FILE {
            return Err(UpsertError::TooLarge("data files"));
        }
        let pos = row_pos(pos)?;
        self.store_mut().put(key, pack(file, pos));
        self.check_bound()
    }

    fn check_bound(&self) -> Result<(), UpsertError> {
        match self.settings.max_keys {
            Some(max) if self.len() > max => Err(UpsertError::TooManyKeys(max)),
            _ => Ok(()),
        }
    }

    /// Records that `key` has no live row.
    pub fn remove(&mut self, key: &KeyHash) {
        self.store_mut().delete(*key);
    }

    /// The table snapshot the index reflects.
    pub fn snapshot(&self) -> Option<i64> {
        self.snapshot
    }

    /// Marks the index as reflecting `snapshot` (after this writer's own commit).
    pub fn set_snapshot(&mut self, snapshot: Option<i64>) {
        self.snapshot = snapshot;
    }

    /// What a spill now may promise the next start; `None` for a temporary index or a
    /// rebuild in progress.
    fn manifest(&self) -> Option<Manifest> {
        let kept = matches!(self.home, Home::Kept { .. }) && !self.rebuilding;
        kept.then(|| Manifest {
            table_uuid: self.table_uuid.clone(),
            key_field_ids: self.key_field_ids.clone(),
            snapshot: self.snapshot,
            files: self
                .files
                .iter()
                .map(|(id, f)| (*id, f.path.to_string()))
                .collect(),
            next_file: self.next_file,
            ..Default::default()
        })
    }

    /// Spills the memory table to disk if it is past its budget, and puts finished
    /// merges in place (keeping the result for the next start). Call at a point the
    /// index is consistent with [`KeyIndex::snapshot`]: after a commit was recorded, or
    /// while rebuilding or catching up.
    pub async fn maintain(&mut self) -> Result<(), UpsertError> {
        if self.store().has_work() {
            self.run_store(false).await?;
        }
        Ok(())
    }

    /// Writes everything to disk and keeps it for the next start (a clean stop).
    pub async fn persist(&mut self) -> Result<(), UpsertError> {
        if matches!(self.home, Home::Kept { .. }) {
            self.run_store(true).await?;
        }
        Ok(())
    }

    async fn run_store(&mut self, force: bool) -> Result<(), UpsertError> {
        let mut store = self.store.take().expect("key store");
        let manifest = self.manifest();
        let started = std::time::Instant::now();
        let (store, result) = tokio::task::spawn_blocking(move || {
            let r = store.maintain(manifest, force);
            (store, r)
        })
        .await
        .map_err(|e| UpsertError::Unsupported(format!("key index thread: {e}")))?;
        self.store = Some(store);
        result.map_err(|e| UpsertError::dir(self.home.dir(), e))?;
        tracing::debug!(dir = %self.home.dir().display(), runs = self.store().runs(), keys = self.len(), ms = started.elapsed().as_millis() as u64, "upsert index maintained on disk");
        Ok(())
    }

    /// The snapshots after the one the index reflects, oldest first; `None` when it is
    /// not an ancestor of the current one.
    fn newer_snapshots(&self, table: &Table) -> Option<Vec<iceberg::spec::SnapshotRef>> {
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
                None => return None,
            }
        }
        newer.reverse();
        Some(newer)
    }

    /// Learns what was committed after the snapshot the index reflects: the keys of the
    /// data files added, the rows their deletes removed, and the rows of data files
    /// removed (rewritten). Returns false when that cannot be done incrementally (the
    /// snapshot left `main`, equality deletes, files that are gone): rebuild then.
    pub async fn catch_up(&mut self, table: &Table, spec: &KeySpec) -> Result<bool, UpsertError> {
        let Some(newer) = self.newer_snapshots(table) else {
            return Ok(false);
        };
        let key_ids = key_field_ids(table, spec)?;
        if key_ids != self.key_field_ids {
            return Ok(false);
        }
        for snapshot in &newer {
            let summary = snapshot.summary();
            let count = |key: &str| {
                summary
                    .additional_properties
                    .get(key)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if count("added-equality-deletes") > 0 || count("added-equality-delete-files") > 0 {
                return Ok(false);
            }
            let mut removed = Vec::new();
            let mut added = Vec::new();
            let mut deletes = Vec::new();
            for manifest_file in manifests::manifest_files(table, snapshot).await? {
                if manifest_file.added_snapshot_id != snapshot.snapshot_id() {
                    continue;
                }
                let manifest = manifests::load(table, &manifest_file).await?;
                for entry in manifest.entries() {
                    let file = entry.data_file();
                    match (entry.status(), entry.content_type()) {
                        (_, DataContentType::EqualityDeletes) => return Ok(false),
                        (ManifestStatus::Existing, _) => {}
                        (status, DataContentType::Data) => {
                            if file.file_format() != DataFileFormat::Parquet {
                                return Ok(false);
                            }
                            let item = (
                                entry.file_path().to_string(),
                                manifest_file.partition_spec_id,
                                file.partition().clone(),
                            );
                            match status {
                                ManifestStatus::Added => added.push(item),
                                _ => removed.push(item),
                            }
                        }
                        (ManifestStatus::Added, DataContentType::PositionDeletes) => {
                            deletes.push(file.clone());
                        }
                        // A removed delete file was applied (compaction) or replaced by a
                        // newer deletion vector that holds its rows.
                        (_, DataContentType::PositionDeletes) => {}
                    }
                }
            }
            // The rows this snapshot deletes, by data file.
            let mut deleted: HashMap<String, Vec<u64>, RandomState> = HashMap::default();
            for file in &deletes {
                if file.file_format() == DataFileFormat::Puffin {
                    let Some(target) = file.referenced_data_file() else {
                        return Ok(false);
                    };
                    let positions = dv::read(table, file).await?;
                    deleted.entry(target).or_default().extend(positions.iter());
                } else {
                    read_position_deletes(table, file.file_path(), &mut deleted).await?;
                }
            }
            // Rows of removed (rewritten) files: their keys live on in the added files,
            // put below, or are gone.
            for (path, _, _) in &removed {
                let Some(id) = self.file_id(path) else {
                    continue;
                };
                match self.forget_file(table, &key_ids, id).await {
                    Ok(()) => self.unregister_file(id),
                    Err(UpsertError::Iceberg(e)) if crate::error::is_missing_file(&e) => {
                        return Ok(false);
                    }
                    Err(e) => return Err(e),
                }
            }
            // Added files without the rows the same snapshot deletes (a key written twice
            // in one commit, in two files, lives in the later row only).
            for (path, spec_id, partition) in &added {
                let id = self.register_file(path, *spec_id, partition);
                let mut gone = deleted.remove(path).unwrap_or_default();
                gone.sort_unstable();
                let store = self.store.as_mut().expect("store");
                scan_keys(table, path, &key_ids, |pos, key| {
                    if gone.binary_search(&pos).is_err() {
                        store.put(key, pack(id, row_pos(pos)?));
                    }
                    Ok(())
                })
                .await?;
                self.check_bound()?;
            }
            for file in &deletes {
                if let Some(target) = file.referenced_data_file()
                    && let Some(id) = self.file_id(&target)
                {
                    self.set_dv(id, file.clone());
                }
            }
            self.forget_deleted(table, &key_ids, deleted).await?;
            self.snapshot = Some(snapshot.snapshot_id());
            self.maintain().await?;
        }
        self.snapshot = table.metadata().current_snapshot_id();
        Ok(true)
    }

    /// Drops the keys whose live row is in data file `id` (removed from the table).
    async fn forget_file(
        &mut self,
        table: &Table,
        key_ids: &[i32],
        id: u32,
    ) -> Result<(), UpsertError> {
        let path = self.file(id)?.path.clone();
        let store = self.store.as_mut().expect("store");
        scan_keys(table, &path, key_ids, |pos, key| {
            if store.get(key)?.map(unpack) == Some((id, pos)) {
                store.delete(key);
            }
            Ok(())
        })
        .await
    }

    /// Drops the keys whose live row is among `deleted` (file -> positions).
    async fn forget_deleted(
        &mut self,
        table: &Table,
        key_ids: &[i32],
        deleted: HashMap<String, Vec<u64>, RandomState>,
    ) -> Result<(), UpsertError> {
        for (path, mut positions) in deleted {
            let Some(&file) = self.file_ids.get(path.as_str()) else {
                continue;
            };
            positions.sort_unstable();
            let store = self.store.as_mut().expect("store");
            scan_keys(table, &path, key_ids, |pos, key| {
                if positions.binary_search(&pos).is_ok()
                    && store.get(key)?.map(unpack) == Some((file, pos))
                {
                    store.delete(key);
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    }
}

fn row_pos(pos: u64) -> Result<u32, UpsertError> {
    u32::try_from(pos).map_err(|_| UpsertError::TooLarge("rows in one data file"))
}

/// Whether `snapshot` is the current snapshot of `table` or one of its ancestors
/// (`None`: the table had no snapshot then, so every snapshot is newer).
fn is_ancestor(table: &Table, snapshot: Option<i64>) -> bool {
    let metadata = table.metadata();
    let Some(wanted) = snapshot else {
        return true;
    };
    let mut current = metadata.current_snapshot();
    while let Some(s) = current {
        if s.snapshot_id() == wanted {
            return true;
        }
        current = s
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    false
}

/// Removes a kept index's files from `dir` (not the lock), the manifest first and
/// durably: runs without a manifest are never opened.
fn clear_dir(dir: &Path) -> Result<(), UpsertError> {
    store::remove_manifest(dir).map_err(|e| UpsertError::dir(dir, e))?;
    let entries = std::fs::read_dir(dir).map_err(|e| UpsertError::dir(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| UpsertError::dir(dir, e))?;
        if entry.file_name() != "LOCK" {
            std::fs::remove_file(entry.path()).map_err(|e| UpsertError::dir(dir, e))?;
        }
    }
    Ok(())
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

/// Calls `f` with the position and key digest of every row of a data file whose key
/// has no null part, reading only the key columns, a batch at a time.
async fn scan_keys(
    table: &Table,
    path: &str,
    key_ids: &[i32],
    mut f: impl FnMut(u64, KeyHash) -> Result<(), UpsertError>,
) -> Result<(), UpsertError> {
    let input = table.file_io().new_input(path)?;
    let meta = input.metadata().await?;
    let reader = iceberg::arrow::ArrowFileReader::new(meta, input.reader().await?);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
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
    let mut stream = builder
        .with_projection(mask)
        .with_batch_size(KEY_BATCH_ROWS)
        .build()?;
    let mut pos = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        // Projected columns come in file order; put them back in key order.
        let columns: Vec<ArrayRef> = order
            .iter()
            .map(|root| {
                let i = sorted.iter().position(|r| r == root).unwrap_or_default();
                batch.column(i).clone()
            })
            .collect();
        for key in KeySpec::of_columns(&columns).map_err(UpsertError::Unsupported)? {
            if let Some(key) = key {
                f(pos, key)?;
            }
            pos += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pack_and_unpack() {
        assert_eq!(unpack(pack(7, 9)), (7, 9));
        assert_eq!(unpack(pack(0, u32::MAX)), (0, u64::from(u32::MAX)));
        assert_ne!(pack(NO_FILE - 1, u32::MAX), run::TOMBSTONE);
    }

    #[tokio::test]
    async fn keys_spill_to_disk_within_the_memory_bound() {
        let mut index = KeyIndex::new(IndexSettings::temporary(2 << 20)).unwrap();
        let file = index.register_file("f.parquet", 0, &Struct::empty());
        for i in 0..200_000u64 {
            let key = twox_hash::XxHash3_128::oneshot(&i.to_le_bytes());
            index.put(key, file, i).unwrap();
            if i % 10_000 == 0 {
                index.maintain().await.unwrap();
            }
        }
        index.maintain().await.unwrap();
        assert!(index.store().runs() > 0, "spilled");
        assert!(index.memory() < 3 << 20, "{} bytes", index.memory());
        for i in (0..200_000u64).step_by(7) {
            let key = twox_hash::XxHash3_128::oneshot(&i.to_le_bytes());
            assert_eq!(index.get(&key).unwrap(), Some((file, i)));
        }
    }
}
