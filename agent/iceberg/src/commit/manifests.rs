//! Reading a snapshot's files: manifests, loaded once per process.
//!
//! A manifest file never changes after it is written (its name holds a fresh UUID), so
//! the parsed manifest is cached by path. Commits that remove files, the upsert index,
//! compaction and expiry all walk the manifests of the current snapshot; without the
//! cache each walk would read and parse every manifest again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use iceberg::Result;
use iceberg::spec::{DataContentType, ManifestContentType, ManifestEntryRef, ManifestFile};
use iceberg::spec::{Manifest, SnapshotRef};
use iceberg::table::Table;

/// Manifest entries kept in the cache (about 1 KB each with statistics).
const CACHE_ENTRIES: usize = 200_000;

struct Cache {
    manifests: HashMap<String, Arc<Manifest>>,
    order: VecDeque<String>,
    entries: usize,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// The manifest `file` names, from the cache or read and parsed (entries inherit the
/// sequence numbers and snapshot id of the manifest list entry).
pub async fn load(table: &Table, file: &ManifestFile) -> Result<Arc<Manifest>> {
    if let Some(m) = cached(&file.manifest_path) {
        return Ok(m);
    }
    let manifest = Arc::new(file.load_manifest(table.file_io()).await?);
    let mut guard = CACHE.lock().expect("manifest cache");
    let cache = guard.get_or_insert_with(|| Cache {
        manifests: HashMap::new(),
        order: VecDeque::new(),
        entries: 0,
    });
    if !cache.manifests.contains_key(&file.manifest_path) {
        cache.entries += manifest.entries().len();
        cache
            .manifests
            .insert(file.manifest_path.clone(), manifest.clone());
        cache.order.push_back(file.manifest_path.clone());
        while cache.entries > CACHE_ENTRIES
            && let Some(old) = cache.order.pop_front()
        {
            if let Some(m) = cache.manifests.remove(&old) {
                cache.entries -= m.entries().len();
            }
        }
    }
    Ok(manifest)
}

fn cached(path: &str) -> Option<Arc<Manifest>> {
    CACHE
        .lock()
        .expect("manifest cache")
        .as_ref()
        .and_then(|c| c.manifests.get(path).cloned())
}

/// One live file of a snapshot, with the manifest that lists it.
#[derive(Debug, Clone)]
pub struct LiveFile {
    /// The manifest list entry of the manifest holding it.
    pub manifest: Arc<ManifestFile>,
    /// The entry (status added or existing), with inherited sequence numbers.
    pub entry: ManifestEntryRef,
}

impl LiveFile {
    /// Data, position deletes (files or deletion vectors) or equality deletes.
    pub fn content(&self) -> DataContentType {
        self.entry.content_type()
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        self.entry.file_path()
    }

    /// The file's data sequence number.
    pub fn sequence_number(&self) -> i64 {
        self.entry.sequence_number().unwrap_or_default()
    }

    /// A deletion vector: the key of the blob within its Puffin file.
    pub fn key(&self) -> FileKey {
        FileKey::of(self.entry.data_file())
    }
}

/// Identifies one entry of a table: a file path, plus the blob offset for deletion
/// vectors (several live in one Puffin file).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// File path.
    pub path: String,
    /// Blob offset within a Puffin file (deletion vectors), else `None`.
    pub offset: Option<i64>,
}

impl FileKey {
    /// The key of `file`.
    pub fn of(file: &iceberg::spec::DataFile) -> FileKey {
        FileKey {
            path: file.file_path().to_string(),
            offset: file.content_offset(),
        }
    }
}

/// The manifest list entries of `snapshot`.
pub async fn manifest_files(table: &Table, snapshot: &SnapshotRef) -> Result<Vec<ManifestFile>> {
    Ok(table
        .manifest_list_reader(snapshot)
        .load()
        .await?
        .consume_entries()
        .into_iter()
        .collect())
}

/// Every live file (data and deletes) of `snapshot`.
pub async fn live_files(table: &Table, snapshot: &SnapshotRef) -> Result<Vec<LiveFile>> {
    live_files_of(table, snapshot, None).await
}

/// Live files of `snapshot` from manifests of one content type only (`None`: all).
pub async fn live_files_of(
    table: &Table,
    snapshot: &SnapshotRef,
    content: Option<ManifestContentType>,
) -> Result<Vec<LiveFile>> {
    let mut out = Vec::new();
    for file in manifest_files(table, snapshot).await? {
        if content.is_some_and(|c| c != file.content) {
            continue;
        }
        if !(file.has_added_files() || file.has_existing_files()) {
            continue;
        }
        let manifest = load(table, &file).await?;
        let file = Arc::new(file);
        for entry in manifest.entries() {
            if entry.is_alive() {
                out.push(LiveFile {
                    manifest: file.clone(),
                    entry: entry.clone(),
                });
            }
        }
    }
    Ok(out)
}
