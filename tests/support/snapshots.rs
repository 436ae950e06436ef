//! What every snapshot of a table must say about itself, as the Iceberg spec and the
//! Java library write it: the files it removed are `DELETED` entries of its own
//! manifests, the files it added are its `ADDED` entries, and its summary's counts and
//! totals match its manifests. Checked for every engine's snapshots alike.

use std::collections::{HashMap, HashSet};

use anyhow::{Result, ensure};
use floe_iceberg::manifests::{self, FileKey, LiveFile};
use iceberg::spec::{DataContentType, ManifestStatus, SnapshotRef};
use iceberg::table::Table;

/// The live files of a snapshot, by entry (a deletion vector is one entry of a Puffin
/// file that may hold several).
async fn live(table: &Table, snapshot: &SnapshotRef) -> Result<HashMap<FileKey, LiveFile>> {
    Ok(manifests::live_files(table, snapshot)
        .await?
        .into_iter()
        .map(|f| (f.key(), f))
        .collect())
}

/// Checks every snapshot of `table` whose parent is still in the metadata; returns how
/// many it checked, per operation (`append`, `replace`, ...).
pub async fn check_all(table: &Table) -> Result<HashMap<String, usize>> {
    let metadata = table.metadata();
    let mut checked: HashMap<String, usize> = HashMap::new();
    for snapshot in metadata.snapshots() {
        let Some(parent) = snapshot
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id))
        else {
            continue;
        };
        check(table, parent, snapshot).await?;
        let operation = snapshot.summary().operation.as_str().to_string();
        *checked.entry(operation).or_default() += 1;
    }
    Ok(checked)
}

async fn check(table: &Table, parent: &SnapshotRef, snapshot: &SnapshotRef) -> Result<()> {
    let id = snapshot.snapshot_id();
    let summary = &snapshot.summary().additional_properties;
    let what = format!(
        "snapshot {id} ({}, by {})",
        snapshot.summary().operation.as_str(),
        summary
            .get("floe.pipeline")
            .or(summary.get("floe.maintenance"))
            .map(|p| format!("Floe {p}"))
            .or_else(|| summary.get("engine-name").cloned())
            .unwrap_or_else(|| "another engine".into())
    );
    let before = live(table, parent).await?;
    let after = live(table, snapshot).await?;
    let removed: HashSet<&FileKey> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    let added: HashSet<&FileKey> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    let (mut listed_deleted, mut listed_added) = (HashSet::new(), HashSet::new());
    for file in manifests::manifest_files(table, snapshot).await? {
        if file.added_snapshot_id != id {
            continue;
        }
        for entry in manifests::load(table, &file).await?.entries() {
            match entry.status() {
                ManifestStatus::Deleted => listed_deleted.insert(FileKey::of(entry.data_file())),
                ManifestStatus::Added => listed_added.insert(FileKey::of(entry.data_file())),
                ManifestStatus::Existing => false,
            };
        }
    }
    let as_set = |s: &HashSet<&FileKey>| s.iter().map(|k| (*k).clone()).collect::<HashSet<_>>();
    ensure!(
        listed_deleted == as_set(&removed),
        "{what}: removed {} files but lists {} as DELETED",
        removed.len(),
        listed_deleted.len()
    );
    ensure!(
        listed_added == as_set(&added),
        "{what}: added {} files but lists {} as ADDED",
        added.len(),
        listed_added.len()
    );
    let count = |files: &mut dyn Iterator<Item = &LiveFile>, data: bool| -> (u64, u64) {
        files
            .filter(|f| (f.content() == DataContentType::Data) == data)
            .fold((0, 0), |(n, r), f| (n + 1, r + f.entry.record_count()))
    };
    let get = |key: &str| {
        summary
            .get(key)
            .map(|v| v.parse::<u64>().unwrap_or(u64::MAX))
    };
    let (added_data, added_records) = count(&mut added.iter().map(|p| &after[*p]), true);
    let (removed_data, removed_records) = count(&mut removed.iter().map(|p| &before[*p]), true);
    let (added_deletes, _) = count(&mut added.iter().map(|p| &after[*p]), false);
    let (removed_deletes, _) = count(&mut removed.iter().map(|p| &before[*p]), false);
    let (total_data, total_records) = count(&mut after.values(), true);
    let (total_deletes, _) = count(&mut after.values(), false);
    for (key, want) in [
        ("added-data-files", added_data),
        ("deleted-data-files", removed_data),
        ("added-records", added_records),
        ("deleted-records", removed_records),
        ("added-delete-files", added_deletes),
        ("removed-delete-files", removed_deletes),
    ] {
        ensure!(
            get(key).unwrap_or(0) == want,
            "{what}: summary {key} = {:?}, the manifests say {want}",
            get(key)
        );
    }
    for (key, want) in [
        ("total-data-files", total_data),
        ("total-records", total_records),
        ("total-delete-files", total_deletes),
    ] {
        ensure!(
            get(key) == Some(want),
            "{what}: summary {key} = {:?}, the manifests say {want}",
            get(key)
        );
    }
    Ok(())
}
