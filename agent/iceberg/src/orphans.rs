//! Orphan-file cleanup: files under the table's location that nothing references.
//!
//! Referenced: the current metadata file and every file in the metadata log, the
//! manifest list of every snapshot, every manifest those list and every file any of
//! those manifests names (whatever the entry's status). A file that is none of these
//! and was last modified more than `orphan_age` ago is deleted: a data file whose
//! commit failed, a manifest of an attempt that lost a race, an upload cut short. The
//! age keeps files of commits still in progress out of reach: the config refuses an
//! `orphan_age` below what a pipeline's files may wait for their commit
//! (`commit_interval` plus the time it keeps retrying a commit).
//!
//! The files are listed first and the table is loaded again after the listing: a
//! commit that lands while the listing runs references files the listing saw, and the
//! table loaded before it would not know them. When a file of that metadata is gone
//! before it is read (another maintainer's expiry deleted it), the run deletes nothing
//! and says so; the next run lists again.
//!
//! Another table whose location lies under this one's (a directory holding its own
//! `metadata/*.metadata.json`) is not this table's: its files are never candidates.
//!
//! Local (`file://`) warehouses are walked on the file system; S3 warehouses are listed
//! through [`floe_iceberg::object_store`] with the table's own storage settings and
//! credentials.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use iceberg::table::Table;

use crate::Error;
use crate::manifests;
use crate::object_store::ObjectStore;

/// The local directory of a `file://` (or plain path) location, `None` for object stores.
pub fn local_dir(location: &str) -> Option<PathBuf> {
    let path = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    path.starts_with('/').then(|| PathBuf::from(path))
}

fn normalize(path: &str) -> String {
    local_dir(path)
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_else(|| path.to_string())
}

/// Deletes unreferenced files older than `age` under `table`'s location; `reload`
/// loads the table again (after the listing).
pub async fn remove_orphans<F, Fut>(
    table: &Table,
    reload: F,
    age: Duration,
    dry_run: bool,
) -> Result<String, Error>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Table, iceberg::Error>>,
{
    let location = table.metadata().location();
    let cutoff = SystemTime::now()
        .checked_sub(age)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let (found, deleted, bytes) = if let Some(root) = local_dir(location) {
        let (found, old, nested) = list_local(root.clone(), cutoff).await?;
        let Some(referenced) = referenced_now(reload).await? else {
            return Ok(RACED.into());
        };
        let nested = nested_tables(&root.to_string_lossy(), nested.iter().map(String::as_str));
        let orphans: Vec<(PathBuf, u64)> = old
            .into_iter()
            .filter(|(p, _)| {
                let p = p.to_string_lossy();
                !referenced.contains(p.as_ref()) && !under_any(&p, &nested)
            })
            .collect();
        let (deleted, bytes) = remove_local(orphans, dry_run).await?;
        (found, deleted, bytes)
    } else {
        let props = table.file_io().config().props();
        let Some(store) = ObjectStore::open(location, props).map_err(other)? else {
            return Ok(format!(
                "skipped: listing files is not supported for {location}"
            ));
        };
        // Listed first: a file written after the listing is never a candidate.
        let listed = store.list().await.map_err(other)?;
        let Some(referenced) = referenced_now(reload).await? else {
            return Ok(RACED.into());
        };
        let nested = nested_tables(location, listed.iter().map(|f| f.location.as_str()));
        let mut deleted = 0;
        let mut bytes = 0;
        for f in &listed {
            let old = f.modified.is_some_and(|m| m < cutoff);
            if old && !referenced.contains(&f.location) && !under_any(&f.location, &nested) {
                if !dry_run {
                    store.delete(&f.location).await.map_err(other)?;
                }
                deleted += 1;
                bytes += f.size;
            }
        }
        (listed.len(), deleted, bytes)
    };
    Ok(format!(
        "{} {deleted} unreferenced files older than {} ({}) of {found}",
        if dry_run { "would delete" } else { "deleted" },
        humantime::format_duration(age),
        bytesize::ByteSize::b(bytes).display().iec()
    ))
}

/// The roots of other tables under `location`: directories (other than `location`)
/// holding a `metadata/*.metadata.json` among `paths`.
fn nested_tables<'a>(location: &str, paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let own = location.trim_end_matches('/');
    let mut roots: Vec<String> = paths
        .filter(|p| p.ends_with(".metadata.json"))
        .filter_map(|p| p.rsplit_once("/metadata/").map(|(root, _)| root))
        .filter(|root| *root != own && !root.contains("/metadata/"))
        .map(str::to_string)
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Whether `path` lies under one of `roots`.
fn under_any(path: &str, roots: &[String]) -> bool {
    roots.iter().any(|r| {
        path.strip_prefix(r.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// Files of a local walk: (files found, those last modified before the cutoff with
/// their sizes, the metadata files among all found).
type LocalListing = (usize, Vec<(PathBuf, u64)>, Vec<String>);

/// Walks the local directory `root`.
async fn list_local(root: PathBuf, cutoff: SystemTime) -> Result<LocalListing, Error> {
    tokio::task::spawn_blocking(move || {
        let mut found = 0usize;
        let mut old = Vec::new();
        let mut metadata = Vec::new();
        walk(&root, &mut |path: &Path, meta: &std::fs::Metadata| {
            found += 1;
            let name = path.to_string_lossy();
            if name.ends_with(".metadata.json") {
                metadata.push(name.to_string());
            }
            if meta.modified().map(|m| m < cutoff).unwrap_or(false) {
                old.push((path.to_path_buf(), meta.len()));
            }
        })?;
        Ok::<_, std::io::Error>((found, old, metadata))
    })
    .await
    .map_err(|e| Error::Other(e.to_string()))?
    .map_err(|e| Error::Other(format!("listing the table's files: {e}")))
}

/// Deletes `orphans` (unless `dry_run`): (deleted, bytes deleted).
async fn remove_local(orphans: Vec<(PathBuf, u64)>, dry_run: bool) -> Result<(usize, u64), Error> {
    tokio::task::spawn_blocking(move || {
        let mut bytes = 0;
        for (p, len) in &orphans {
            if !dry_run {
                match std::fs::remove_file(p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            bytes += len;
        }
        Ok::<_, std::io::Error>((orphans.len(), bytes))
    })
    .await
    .map_err(|e| Error::Other(e.to_string()))?
    .map_err(|e| Error::Other(format!("listing the table's files: {e}")))
}

/// What a run reports when another maintainer expired snapshots while it read them.
const RACED: &str = "skipped: another maintainer expired snapshots while they were read; \
     the next run lists again";

/// Every file the table as loaded by `reload` references, or `None` when a file of its
/// metadata is gone meanwhile (another maintainer's expiry deleted it): deleting nothing
/// is safe, and the next run starts again.
async fn referenced_now<F, Fut>(reload: F) -> Result<Option<HashSet<String>>, Error>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Table, iceberg::Error>>,
{
    match referenced(&reload().await?).await {
        Ok(files) => Ok(Some(files)),
        Err(e) if crate::error::is_missing_file(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every file the table's metadata references (local paths for local tables).
async fn referenced(table: &Table) -> Result<HashSet<String>, iceberg::Error> {
    let metadata = table.metadata();
    let mut out = HashSet::new();
    if let Some(current) = table.metadata_location() {
        out.insert(normalize(current));
    }
    for log in metadata.metadata_log() {
        out.insert(normalize(&log.metadata_file));
    }
    for stats in metadata.statistics_iter() {
        out.insert(normalize(&stats.statistics_path));
    }
    for stats in metadata.partition_statistics_iter() {
        out.insert(normalize(&stats.statistics_path));
    }
    let mut seen = HashSet::new();
    for s in metadata.snapshots() {
        out.insert(normalize(s.manifest_list()));
        for file in manifests::manifest_files(table, s).await? {
            out.insert(normalize(&file.manifest_path));
            if !seen.insert(file.manifest_path.clone()) {
                continue;
            }
            let manifest = manifests::load(table, &file).await?;
            for e in manifest.entries() {
                out.insert(normalize(e.file_path()));
            }
        }
    }
    Ok(out)
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, &std::fs::Metadata)) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let meta = e.metadata()?;
        if meta.is_dir() {
            walk(&e.path(), visit)?;
        } else if meta.is_file() {
            visit(&e.path(), &meta);
        }
    }
    Ok(())
}

/// An object store failure as this crate's error: transient, like every listing or
/// deletion failure.
// `Error::Other` holds text only; the object store's error is kept in its words.
fn other(e: crate::object_store::ObjectStoreError) -> Error {
    Error::Other(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_map_to_local_paths() {
        assert_eq!(local_dir("file:///w/t"), Some(PathBuf::from("/w/t")));
        assert_eq!(local_dir("file:/w/t"), Some(PathBuf::from("/w/t")));
        assert_eq!(local_dir("/w/t"), Some(PathBuf::from("/w/t")));
        assert_eq!(local_dir("s3://bucket/w/t"), None);
    }

    #[test]
    fn tables_nested_under_the_location_are_not_its_files() {
        let paths = [
            "s3://b/w/t/metadata/00001-a.metadata.json",
            "s3://b/w/t/data/x.parquet",
            "s3://b/w/t/inner/metadata/00000-b.metadata.json",
            "s3://b/w/t/inner/data/y.parquet",
            "s3://b/w/t/innerish/data/z.parquet",
        ];
        let nested = nested_tables("s3://b/w/t/", paths.into_iter());
        assert_eq!(nested, ["s3://b/w/t/inner"]);
        assert!(under_any("s3://b/w/t/inner/data/y.parquet", &nested));
        assert!(!under_any("s3://b/w/t/innerish/data/z.parquet", &nested));
        assert!(!under_any("s3://b/w/t/data/x.parquet", &nested));
    }
}
