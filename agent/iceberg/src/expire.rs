//! Snapshot expiry, removal of the files only expired snapshots referenced, and
//! metadata-log trimming.
//!
//! Kept: the newest `keep_snapshots` snapshots of `main`, every snapshot newer than
//! `max_snapshot_age`, the head of every branch and tag and the whole history of
//! branches other than `main`. The rest is removed in one metadata commit, which first
//! writes, for every pipeline whose offsets the table stores, the table property
//! `floe.offsets.<pipeline>` (unless it already holds them): once the pipeline's own
//! snapshots are gone the property is where its offsets are found.
//!
//! Files then deleted: the manifest lists of the removed snapshots, their manifests and
//! the data and delete files those list, minus everything a kept snapshot still reaches
//! (its manifest list, its manifests, and the live files in them).

use std::collections::{HashMap, HashSet};

use iceberg::TableUpdate;
use iceberg::spec::{MAIN_BRANCH, SnapshotRef, TableMetadata};
use iceberg::table::Table;

use crate::Error;
use crate::commit_updates;
use crate::manifests;
use crate::{
    CatalogHandle, DELETE_AFTER_COMMIT, OffsetMap, OffsetsError, OffsetsSource, StoredOffsets,
};

/// What snapshot expiry and metadata trimming keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpireOptions {
    /// Snapshots of `main` always kept, newest first.
    pub keep_snapshots: usize,
    /// Snapshots newer than this are kept too (zero: only `keep_snapshots`).
    pub max_snapshot_age: std::time::Duration,
    /// Entries kept in the metadata log; older metadata files are deleted.
    pub keep_metadata_files: usize,
}

/// Table property: entries kept in the metadata log.
const PREVIOUS_VERSIONS_MAX: &str = "write.metadata.previous-versions-max";

/// The snapshot ids to remove from `metadata`.
fn to_expire(metadata: &TableMetadata, config: &ExpireOptions, now_ms: i64) -> Vec<i64> {
    let mut keep: HashSet<i64> = HashSet::new();
    let mut current = metadata.current_snapshot();
    let mut n = 0;
    while let Some(s) = current {
        if n < config.keep_snapshots {
            keep.insert(s.snapshot_id());
        }
        n += 1;
        current = s
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    let oldest_kept = now_ms - config.max_snapshot_age.as_millis() as i64;
    for s in metadata.snapshots() {
        if s.timestamp_ms() >= oldest_kept {
            keep.insert(s.snapshot_id());
        }
    }
    for (name, snapshot_id, is_branch) in refs(metadata) {
        keep.insert(snapshot_id);
        if name != MAIN_BRANCH && is_branch {
            let mut s = metadata.snapshot_by_id(snapshot_id);
            while let Some(snap) = s {
                keep.insert(snap.snapshot_id());
                s = snap
                    .parent_snapshot_id()
                    .and_then(|id| metadata.snapshot_by_id(id));
            }
        }
    }
    let mut out: Vec<i64> = metadata
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| !keep.contains(id))
        .collect();
    out.sort_unstable();
    out
}

// upstream: public snapshot refs (iceberg-rust 0.10 keeps TableMetadata::refs private;
// delete when it is public)
/// Every branch and tag: (name, snapshot id, whether a branch). iceberg-rust keeps the
/// refs private; they are read from the metadata's JSON form.
fn refs(metadata: &TableMetadata) -> Vec<(String, i64, bool)> {
    let Ok(value) = serde_json::to_value(metadata) else {
        return Vec::new();
    };
    let Some(refs) = value.get("refs").and_then(|r| r.as_object()) else {
        return Vec::new();
    };
    refs.iter()
        .filter_map(|(name, r)| {
            let id = r.get("snapshot-id")?.as_i64()?;
            let branch = r.get("type").and_then(|t| t.as_str()) != Some("tag");
            Some((name.clone(), id, branch))
        })
        .collect()
}

/// `floe.offsets.<pipeline>` values to write so every pipeline's offsets survive.
fn offsets_properties(metadata: &TableMetadata) -> Result<HashMap<String, String>, OffsetsError> {
    let mut out = HashMap::new();
    for pipeline in OffsetMap::pipelines(metadata) {
        let (offsets, source) = OffsetMap::located(metadata, &pipeline)?;
        let OffsetsSource::Snapshot(snapshot_id) = source else {
            continue;
        };
        let key = StoredOffsets::property_key(&pipeline);
        let stored = metadata
            .properties()
            .get(&key)
            .and_then(|v| StoredOffsets::from_property_value(v).ok());
        if stored.as_ref().map(|s| &s.offsets) != Some(&offsets) {
            out.insert(
                key,
                StoredOffsets {
                    snapshot_id,
                    offsets,
                }
                .to_property_value(),
            );
        }
    }
    Ok(out)
}

// upstream: expire_snapshots with file deletion (iceberg-rust 0.10 has RemoveSnapshots
// but no ExpireSnapshots action that deletes unreachable files; delete when it has)
/// Expires snapshots of `table` and deletes the files only they referenced.
pub async fn expire(
    catalog: &CatalogHandle,
    table: Table,
    config: &ExpireOptions,
    dry_run: bool,
) -> Result<String, Error> {
    let now = chrono::Utc::now().timestamp_millis();
    let before = table.metadata().snapshots().count();
    let planned = to_expire(table.metadata(), config, now);
    if planned.is_empty() {
        return Ok(format!("nothing to expire ({before} snapshots kept)"));
    }
    if dry_run {
        return Ok(format!(
            "would remove {} of {before} snapshots",
            planned.len()
        ));
    }
    let old = table.clone();
    let committed = commit_updates(
        catalog.catalog.as_ref(),
        catalog.committer.as_ref(),
        table,
        |base| {
            let metadata = base.metadata();
            let ids = to_expire(metadata, config, now);
            if ids.is_empty() {
                return Ok(None);
            }
            let props =
                offsets_properties(metadata).map_err(|e| crate::CommitFailure::Iceberg {
                    table: base.identifier().to_string(),
                    source: Box::new(
                        iceberg::Error::new(
                            iceberg::ErrorKind::DataInvalid,
                            "the stored offsets cannot be carried into table properties",
                        )
                        .with_source(e),
                    ),
                })?;
            let mut updates = Vec::new();
            if !props.is_empty() {
                updates.push(TableUpdate::SetProperties { updates: props });
            }
            updates.push(TableUpdate::RemoveSnapshots { snapshot_ids: ids });
            Ok(Some(updates))
        },
    )
    .await
    .map_err(Box::new)?;
    // Nothing left to expire on a later attempt can mean that an earlier attempt landed
    // and its answer was lost: what was removed is read off the table either way, so
    // the files only removed snapshots referenced are deleted in both cases.
    let new = match committed {
        Some(new) => new,
        None => catalog.catalog.load_table(old.identifier()).await?,
    };
    let removed: Vec<SnapshotRef> = old
        .metadata()
        .snapshots()
        .filter(|s| new.metadata().snapshot_by_id(s.snapshot_id()).is_none())
        .cloned()
        .collect();
    if removed.is_empty() {
        return Ok(format!("nothing to expire ({before} snapshots kept)"));
    }
    let deleted = delete_unreachable(&old, &new, &removed).await?;
    Ok(format!(
        "removed {} of {before} snapshots; deleted {} files no kept snapshot references ({} manifest lists, {} manifests, {} data and delete files)",
        removed.len(),
        deleted.0 + deleted.1 + deleted.2,
        deleted.0,
        deleted.1,
        deleted.2
    ))
}

/// Deletes what only `removed` (snapshots of `old`) referenced; returns the counts of
/// manifest lists, manifests and data/delete files deleted.
async fn delete_unreachable(
    old: &Table,
    new: &Table,
    removed: &[SnapshotRef],
) -> Result<(usize, usize, usize), Error> {
    let mut kept_lists = HashSet::new();
    let mut kept_manifests = HashSet::new();
    let mut kept_files = HashSet::new();
    for s in new.metadata().snapshots() {
        kept_lists.insert(s.manifest_list().to_string());
        for file in manifests::manifest_files(new, s).await? {
            if !kept_manifests.insert(file.manifest_path.clone()) {
                continue;
            }
            let manifest = manifests::load(new, &file).await?;
            for e in manifest.entries().iter().filter(|e| e.is_alive()) {
                kept_files.insert(e.file_path().to_string());
            }
        }
    }
    let mut lists = Vec::new();
    let mut manifest_paths = Vec::new();
    let mut files = Vec::new();
    let mut seen = HashSet::new();
    for s in removed {
        if !kept_lists.contains(s.manifest_list()) {
            lists.push(s.manifest_list().to_string());
        }
        let entries = match manifests::manifest_files(old, s).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(table = %old.identifier(), list = %s.manifest_list(), error = %e, "cannot read the manifest list of an expired snapshot; its files are left to orphan cleanup");
                continue;
            }
        };
        for file in entries {
            if kept_manifests.contains(&file.manifest_path)
                || !seen.insert(file.manifest_path.clone())
            {
                continue;
            }
            manifest_paths.push(file.manifest_path.clone());
            match manifests::load(old, &file).await {
                Ok(manifest) => {
                    for e in manifest.entries() {
                        let path = e.file_path();
                        if !kept_files.contains(path) && seen.insert(path.to_string()) {
                            files.push(path.to_string());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(table = %old.identifier(), manifest = %file.manifest_path, error = %e, "cannot read a manifest of an expired snapshot; its files are left to orphan cleanup");
                }
            }
        }
    }
    let io = new.file_io();
    let mut counts = (0, 0, 0);
    for (paths, count) in [
        (&files, &mut counts.2),
        (&manifest_paths, &mut counts.1),
        (&lists, &mut counts.0),
    ] {
        for p in paths {
            match io.delete(p).await {
                Ok(()) => *count += 1,
                Err(e) => {
                    tracing::warn!(table = %new.identifier(), file = %p, error = %e, "could not delete a file of an expired snapshot")
                }
            }
        }
    }
    Ok(counts)
}

/// Keeps `keep_metadata_files` entries in the metadata log: sets the table properties
/// that make every commit drop (and delete) older entries, and on a local warehouse
/// deletes metadata files older than the oldest entry kept.
pub async fn trim_metadata(
    catalog: &CatalogHandle,
    table: Table,
    config: &ExpireOptions,
    dry_run: bool,
) -> Result<String, Error> {
    let keep = config.keep_metadata_files.to_string();
    let wanted = HashMap::from([
        (PREVIOUS_VERSIONS_MAX.to_string(), keep),
        (DELETE_AFTER_COMMIT.to_string(), "true".to_string()),
    ]);
    let missing = |t: &Table| -> HashMap<String, String> {
        wanted
            .iter()
            .filter(|(k, v)| t.metadata().properties().get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut table = table;
    let mut msg = Vec::new();
    if !missing(&table).is_empty() {
        if dry_run {
            msg.push(format!(
                "would set {PREVIOUS_VERSIONS_MAX} = {}",
                config.keep_metadata_files
            ));
        } else if let Some(t) = commit_updates(
            catalog.catalog.as_ref(),
            catalog.committer.as_ref(),
            table.clone(),
            |base| {
                let updates = missing(base);
                Ok((!updates.is_empty()).then(|| vec![TableUpdate::SetProperties { updates }]))
            },
        )
        .await
        .map_err(Box::new)?
        {
            msg.push(format!(
                "set {PREVIOUS_VERSIONS_MAX} = {}",
                config.keep_metadata_files
            ));
            table = t;
        }
    }
    let log = table.metadata().metadata_log();
    msg.push(format!("metadata log holds {} entries", log.len()));
    match crate::orphans::local_dir(table.metadata().location()) {
        Some(dir) => {
            let deleted = sweep_old_metadata(&table, &dir.join("metadata"), dry_run).await?;
            msg.push(format!(
                "{} {deleted} older metadata files",
                if dry_run { "would delete" } else { "deleted" }
            ));
        }
        None => msg.push("older files are deleted by the catalog at commit".into()),
    }
    Ok(msg.join("; "))
}

/// Deletes `*.metadata.json` files in `dir` whose version is below the oldest one the
/// metadata log keeps (writers only ever add higher versions, so none is in flight).
async fn sweep_old_metadata(
    table: &Table,
    dir: &std::path::Path,
    dry_run: bool,
) -> Result<usize, Error> {
    let current = table.metadata_location().unwrap_or_default().to_string();
    let mut versions: Vec<u64> = table
        .metadata()
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.as_str())
        .chain(std::iter::once(current.as_str()))
        .filter_map(version_of)
        .collect();
    versions.sort_unstable();
    let Some(&oldest) = versions.first() else {
        return Ok(0);
    };
    let dir = dir.to_path_buf();
    let deleted = tokio::task::spawn_blocking(move || -> std::io::Result<usize> {
        let mut n = 0;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(0);
        };
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            if !name.ends_with(".metadata.json") {
                continue;
            }
            if version_of(&name).is_some_and(|v| v < oldest) {
                if !dry_run {
                    std::fs::remove_file(e.path())?;
                }
                n += 1;
            }
        }
        Ok(n)
    })
    .await
    .map_err(|e| Error::Other(e.to_string()))?
    .map_err(|e| Error::Other(format!("sweeping old metadata files: {e}")))?;
    Ok(deleted)
}

/// The version number a metadata file name starts with (`00012-<uuid>.metadata.json`).
fn version_of(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let (digits, rest) = name.split_once('-')?;
    rest.ends_with(".metadata.json")
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    use iceberg::{NamespaceIdent, TableCreation, TableIdent, TableRequirement};

    use super::*;
    use crate::{CatalogConfig, CommitBackend, CommitError, StagedSnapshot, open_catalog};

    /// Applies the first commit but answers it as lost (a 5xx after the catalog wrote it).
    #[derive(Debug)]
    struct FirstAnswerLost {
        inner: Arc<dyn CommitBackend>,
        calls: AtomicU32,
    }

    #[async_trait]
    impl CommitBackend for FirstAnswerLost {
        async fn commit(
            &self,
            base: &Table,
            requirements: Vec<TableRequirement>,
            updates: Vec<TableUpdate>,
        ) -> Result<Table, CommitError> {
            let table = self.inner.commit(base, requirements, updates).await?;
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(CommitError::Unknown("HTTP 504 after the commit".into()));
            }
            Ok(table)
        }
    }

    #[tokio::test]
    async fn an_expiry_whose_answer_was_lost_still_deletes_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut handle = open_catalog(
            "local",
            &CatalogConfig::embedded(dir.path().join("catalog.db"), dir.path().join("warehouse")),
        )
        .await
        .unwrap();
        let ns = NamespaceIdent::new("ns".into());
        handle
            .catalog
            .create_namespace(&ns, HashMap::new())
            .await
            .unwrap();
        let schema = Schema::builder()
            .with_fields(vec![Arc::new(NestedField::optional(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            ))])
            .build()
            .unwrap();
        let creation = TableCreation::builder()
            .name("t".into())
            .schema(schema)
            .build();
        handle.catalog.create_table(&ns, creation).await.unwrap();
        let ident = TableIdent::from_strs(["ns", "t"]).unwrap();
        let mut lists = Vec::new();
        for _ in 0..4 {
            let base = handle.catalog.load_table(&ident).await.unwrap();
            let mut staged = StagedSnapshot::write(&base, None, Vec::new(), Vec::new())
                .await
                .unwrap();
            let (requirements, updates) =
                staged.updates(&base, &HashMap::new(), None).await.unwrap();
            let t = handle
                .committer
                .commit(&base, requirements, updates)
                .await
                .unwrap();
            lists.push(
                t.metadata()
                    .current_snapshot()
                    .unwrap()
                    .manifest_list()
                    .to_string(),
            );
        }
        handle.committer = Arc::new(FirstAnswerLost {
            inner: handle.committer.clone(),
            calls: AtomicU32::new(0),
        });
        let config = ExpireOptions {
            keep_snapshots: 1,
            max_snapshot_age: std::time::Duration::ZERO,
            keep_metadata_files: 10,
        };
        let table = handle.catalog.load_table(&ident).await.unwrap();
        let report = expire(&handle, table, &config, false).await.unwrap();
        assert!(report.starts_with("removed 3 of 4"), "{report}");
        for (i, list) in lists.iter().enumerate() {
            let path = list.trim_start_matches("file://");
            assert_eq!(
                std::path::Path::new(path).exists(),
                i == 3,
                "manifest list of snapshot {i}: {report}"
            );
        }
    }

    #[test]
    fn metadata_versions_come_from_file_names() {
        assert_eq!(
            version_of("file:///w/t/metadata/00012-0b1c.metadata.json"),
            Some(12)
        );
        assert_eq!(version_of("00000-x.metadata.json"), Some(0));
        assert_eq!(version_of("snap-1-2.avro"), None);
        assert_eq!(version_of("v3.metadata.json"), None);
    }
}
