//! Maintenance commits: snapshots that rewrite the table's files (compaction), and
//! metadata-only changes (snapshot expiry, properties).
//!
//! A rewrite is decided again at every attempt against the table as it is then
//! ([`Rewrite::plan`]), so it rebases over concurrent commits instead of failing on them:
//! the planner sees every live file of the new parent and either adapts (for example
//! carries a concurrent commit's deletes over to the files it wrote) or gives up with a
//! reason. The snapshot it commits lists every live file of the parent in merged
//! manifests (one per content type and partition spec): files it removes are marked
//! deleted, every other one is kept as it is, its new files are added. Its summary
//! carries every pipeline's offsets forward (`floe.offsets.<pipeline>`), so the lineage
//! still names them after the pipelines' own snapshots expire.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use iceberg::spec::{DataContentType, ManifestContentType, Operation, Summary};
use iceberg::table::Table;
use iceberg::{Catalog, TableRequirement, TableUpdate};

use super::manifests::{self, FileKey, LiveFile};
use super::snapshot::{self, FileStats, SnapshotParts, SpecFile};
use super::{
    COMMIT_KEY, CommitBackend, CommitError, CommitFailure, MAX_ATTEMPTS, OffsetMap, backoff,
    contains_commit, iceberg_failure,
};

/// Summary key naming the maintenance job that made a snapshot.
pub const MAINTENANCE_KEY: &str = "floe.maintenance";

/// What a rewrite commits on a given parent.
#[derive(Debug, Default)]
pub struct RewritePlan {
    /// Live files of the parent to remove.
    pub removed: HashSet<FileKey>,
    /// New files (data and deletes) with their partition spec ids.
    pub added: Vec<SpecFile>,
}

/// A rewrite that can be planned on any parent.
#[async_trait]
pub trait Rewrite: Send {
    /// The plan for parent `table`, whose live files are `live`; `Err(reason)` gives up
    /// (a concurrent change the rewrite cannot absorb).
    async fn plan(&mut self, table: &Table, live: &[LiveFile]) -> Result<RewritePlan, String>;
}

/// How a rewrite ended.
#[derive(Debug)]
pub enum RewriteOutcome {
    /// Committed: the new table.
    Committed(Box<Table>),
    /// Given up, with the planner's reason.
    GaveUp(String),
}

/// Commits a rewrite as a `replace` snapshot with `properties` (plus the carried
/// offsets) in its summary; see the module docs.
pub async fn commit_rewrite(
    catalog: &dyn Catalog,
    backend: &dyn CommitBackend,
    mut base: Table,
    rewrite: &mut dyn Rewrite,
    properties: &HashMap<String, String>,
) -> Result<RewriteOutcome, CommitFailure> {
    let ident = base.identifier().clone();
    let commit_id = properties.get(COMMIT_KEY).cloned();
    let snapshot_id = snapshot::unique_snapshot_id(&base);
    let commit_uuid = uuid::Uuid::now_v7();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(current) = base.metadata().current_snapshot().cloned() else {
            return Ok(RewriteOutcome::GaveUp("the table has no snapshot".into()));
        };
        let live = manifests::live_files(&base, &current)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
        let plan = match rewrite.plan(&base, &live).await {
            Ok(plan) => plan,
            Err(reason) => return Ok(RewriteOutcome::GaveUp(reason)),
        };
        let parts = rewrite_parts(
            &base,
            &live,
            &plan,
            snapshot_id,
            &format!("{commit_uuid}-{attempt}"),
            properties,
        )
        .await
        .map_err(|e| iceberg_failure(&ident, e))?;
        let (requirements, updates) = snapshot::finish(&base, parts)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
        let error = match backend.commit(&base, requirements, updates).await {
            Ok(table) => return Ok(RewriteOutcome::Committed(Box::new(table))),
            Err(e) => e,
        };
        let unknown = matches!(error, CommitError::Unknown(_));
        if matches!(error, CommitError::Failed(_)) || attempt >= MAX_ATTEMPTS {
            return Err(CommitFailure::Catalog {
                table: ident.to_string(),
                source: error,
            });
        }
        tracing::info!(table = %ident, attempt, %error, "maintenance commit did not land; planning again on the new table");
        tokio::time::sleep(backoff(attempt)).await;
        base = catalog
            .load_table(&ident)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
        if unknown
            && let Some(id) = &commit_id
            && contains_commit(&base, id)
        {
            return Ok(RewriteOutcome::Committed(Box::new(base)));
        }
    }
}

/// Merged manifests and summary of a rewrite on `base`.
async fn rewrite_parts<'a>(
    base: &Table,
    live: &[LiveFile],
    plan: &RewritePlan,
    snapshot_id: i64,
    name: &str,
    properties: &HashMap<String, String>,
) -> iceberg::Result<SnapshotParts<'a>> {
    let metadata = base.metadata();
    let mut missing: HashSet<&FileKey> = plan.removed.iter().collect();
    let mut removed = FileStats::default();
    let mut added = FileStats::default();
    // (content, spec id) -> entries kept or removed, and files added.
    type Group<'g> = (Vec<(&'g LiveFile, bool)>, Vec<iceberg::spec::DataFile>);
    let mut groups: Vec<((ManifestContentType, i32), Group<'_>)> = Vec::new();
    fn group<'g, 'v>(
        groups: &'v mut Vec<((ManifestContentType, i32), Group<'g>)>,
        key: (ManifestContentType, i32),
    ) -> &'v mut Group<'g> {
        let i = match groups.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                groups.push((key, (Vec::new(), Vec::new())));
                groups.len() - 1
            }
        };
        &mut groups[i].1
    }
    for f in live {
        let key = f.key();
        let gone = plan.removed.contains(&key);
        if gone {
            missing.remove(&key);
            removed.add(f.entry.data_file());
        }
        group(
            &mut groups,
            (f.manifest.content, f.manifest.partition_spec_id),
        )
        .0
        .push((f, gone));
    }
    if !missing.is_empty() {
        return Err(iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            format!(
                "{} files a rewrite removes are not live in the table",
                missing.len()
            ),
        ));
    }
    for (spec, file) in &plan.added {
        added.add(file);
        let content = match file.content_type() {
            DataContentType::Data => ManifestContentType::Data,
            _ => ManifestContentType::Deletes,
        };
        group(&mut groups, (content, *spec)).1.push(file.clone());
    }
    let mut manifests = Vec::with_capacity(groups.len());
    for (n, ((content, spec_id), (entries, new))) in groups.into_iter().enumerate() {
        if new.is_empty() && entries.iter().all(|(_, gone)| *gone) {
            // Only removals: a manifest of deleted entries helps no reader.
            continue;
        }
        let spec = snapshot::spec_of(metadata, spec_id)?;
        let path = format!("{}/metadata/{name}-c{n}.avro", metadata.location());
        let mut writer = snapshot::manifest_writer(
            base,
            &path,
            snapshot_id,
            metadata.current_schema().clone(),
            spec,
            content,
        )?;
        for (f, gone) in entries {
            if gone {
                snapshot::add_deleted(&mut writer, &f.entry)?;
            } else {
                snapshot::add_existing(&mut writer, &f.entry)?;
            }
        }
        for file in new {
            writer.add_file(file, -1)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    let mut props = properties.clone();
    props.extend(
        OffsetMap::carried_forward(metadata)
            .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e.to_string()))?,
    );
    let summary = Summary {
        operation: Operation::Replace,
        additional_properties: snapshot::summary_properties(
            added,
            removed,
            metadata.current_snapshot().map(|s| s.summary()),
            &props,
        ),
    };
    Ok(SnapshotParts {
        snapshot_id,
        list_name: name.to_string(),
        manifests,
        summary,
        new_schema: None,
    })
}

/// Commits metadata-only updates computed from the table by `updates` (`None`: nothing
/// to do), requiring `main` unchanged; on a conflict it reloads and computes again.
pub async fn commit_updates<F>(
    catalog: &dyn Catalog,
    backend: &dyn CommitBackend,
    mut base: Table,
    mut updates: F,
) -> Result<Option<Table>, CommitFailure>
where
    F: FnMut(&Table) -> Result<Option<Vec<TableUpdate>>, CommitFailure>,
{
    let ident = base.identifier().clone();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(list) = updates(&base)? else {
            return Ok(None);
        };
        let requirements = vec![
            TableRequirement::UuidMatch {
                uuid: base.metadata().uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: iceberg::spec::MAIN_BRANCH.to_string(),
                snapshot_id: base.metadata().current_snapshot_id(),
            },
        ];
        let error = match backend.commit(&base, requirements, list).await {
            Ok(table) => return Ok(Some(table)),
            Err(e) => e,
        };
        if matches!(error, CommitError::Failed(_)) || attempt >= MAX_ATTEMPTS {
            return Err(CommitFailure::Catalog {
                table: ident.to_string(),
                source: error,
            });
        }
        // A lost answer is harmless here: the updates are computed again from the table.
        tokio::time::sleep(backoff(attempt)).await;
        base = catalog
            .load_table(&ident)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
    }
}
