//! Maintenance commits: snapshots that rewrite the table's files (compaction), and
//! metadata-only changes (snapshot expiry, properties).
//!
//! A rewrite is decided again at every attempt against the table as it is then
//! ([`Rewrite::plan`]), so it rebases over concurrent commits instead of failing on them:
//! the planner sees every live file of the new parent and either adapts (for example
//! carries a concurrent commit's deletes over to the files it wrote) or gives up with a
//! reason. Its summary carries every pipeline's offsets forward
//! (`floe.offsets.<pipeline>`), so the lineage still names them after the pipelines' own
//! snapshots expire.
//!
//! The parent's manifests that hold none of the removed files are kept as they are;
//! the ones that do are rewritten with the removed files as `DELETED` entries of this
//! snapshot (as Java's rewrite writes them: another engine's conflict check for a
//! concurrent row-level delete, `validateDataFilesExist`, and incremental readers look
//! for exactly those entries), and the new files get one manifest per content type and
//! partition spec. The next commit drops a manifest with no live entry left, so the
//! number of manifests stays bounded.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::{
    DataContentType, DataFile, ManifestContentType, ManifestFile, Operation, SnapshotRef, Summary,
};
use iceberg::table::Table;
use iceberg::{Catalog, TableRequirement, TableUpdate};

use crate::retry::Policy;

use super::manifests::{self, FileKey, LiveFile};
use super::snapshot::{self, FileStats, SnapshotParts, SpecFile};
use super::{
    COMMIT_KEY, COMMIT_RETRY, CommitBackend, CommitError, CommitFailure, OffsetMap,
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
    /// The plan for parent `table`, whose live files are `live`, or why the rewrite gives
    /// up on the table as it is now.
    async fn plan(&mut self, table: &Table, live: &[LiveFile]) -> Result<RewritePlan, GiveUp>;
}

/// Why a rewrite gives up; the next maintenance run plans again on the table as it is
/// then.
#[derive(Debug, thiserror::Error)]
pub enum GiveUp {
    /// Another writer changed the table in a way the rewrite cannot absorb.
    #[error("{0}")]
    Changed(String),
    /// A file the plan needs could not be read or written.
    #[error("{what}: {source}")]
    Failed {
        /// What the plan was doing.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// How a rewrite ended.
#[derive(Debug)]
pub enum RewriteOutcome {
    /// Committed: the new table.
    Committed(Box<Table>),
    /// Given up, with the planner's reason.
    GaveUp(String),
}

/// A rewrite that lost a race re-plans after a short wait, up to 60 attempts: a lost
/// race is expected next to a busy pipeline (which usually lets it land at the first or
/// second attempt), and re-planning is cheap. A lost answer waits like a commit does.
const REWRITE_RETRY: Policy =
    Policy::backoff(Duration::from_millis(80), Duration::from_millis(80)).attempts(60);

// upstream: rewrite-files action (iceberg-rust 0.10 has no RewriteFiles/ReplaceFiles
// transaction action; delete when it has one that rebases like this)
/// Commits a rewrite as a `replace` snapshot with `properties` (plus the carried
/// offsets) in its summary; see the module docs. Manifests that do not change between
/// attempts (the new files', the rewritten ones of the parent) are written once.
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
    let mut writer = ManifestCache {
        snapshot_id,
        prefix: format!("{}", uuid::Uuid::now_v7()),
        written: 0,
        added: HashMap::new(),
        rewritten: HashMap::new(),
    };
    let mut attempts = REWRITE_RETRY.start();
    loop {
        let attempt = attempts.failures() + 1;
        let Some(current) = base.metadata().current_snapshot().cloned() else {
            return Ok(RewriteOutcome::GaveUp("the table has no snapshot".into()));
        };
        let live = manifests::live_files(&base, &current)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
        let plan = match rewrite.plan(&base, &live).await {
            Ok(plan) => plan,
            Err(reason) => return Ok(RewriteOutcome::GaveUp(reason.to_string())),
        };
        let parts = writer
            .parts(&base, &current, &live, &plan, attempt, properties)
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
        let Some(wait) = attempts.retry_after(error.class()) else {
            return Err(CommitFailure::Catalog {
                table: ident.to_string(),
                source: error,
            });
        };
        tracing::debug!(table = %ident, attempt, %error, "maintenance commit did not land; planning again on the new table");
        let wait = if unknown {
            COMMIT_RETRY.wait(attempt)
        } else {
            wait
        };
        tokio::time::sleep(wait).await;
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

/// The manifests of a rewrite, kept across attempts.
struct ManifestCache {
    snapshot_id: i64,
    prefix: String,
    written: usize,
    /// (content, spec id) -> the added files' keys and their manifest.
    added: HashMap<(ManifestContentType, i32), (Vec<FileKey>, ManifestFile)>,
    /// Parent manifest path -> the keys it loses and its rewritten form.
    rewritten: HashMap<String, (Vec<FileKey>, ManifestFile)>,
}

impl ManifestCache {
    fn path(&mut self, base: &Table) -> String {
        self.written += 1;
        format!(
            "{}/metadata/{}-r{}.avro",
            base.metadata().location(),
            self.prefix,
            self.written
        )
    }

    /// The manifest list entries and summary of `plan` on `base` (current snapshot
    /// `current`, live files `live`).
    async fn parts<'a>(
        &mut self,
        base: &Table,
        current: &SnapshotRef,
        live: &[LiveFile],
        plan: &RewritePlan,
        attempt: u32,
        properties: &HashMap<String, String>,
    ) -> iceberg::Result<SnapshotParts<'a>> {
        let metadata = base.metadata();
        let mut removed = FileStats::default();
        let mut added = FileStats::default();
        // Which removed keys each parent manifest holds.
        let mut hits: HashMap<&str, Vec<FileKey>> = HashMap::new();
        let mut found = 0;
        for f in live {
            let key = f.key();
            if plan.removed.contains(&key) {
                found += 1;
                removed.add(f.entry.data_file());
                hits.entry(f.manifest.manifest_path.as_str())
                    .or_default()
                    .push(key);
            }
        }
        if found != plan.removed.len() {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!(
                    "{} files a rewrite removes are not live in the table",
                    plan.removed.len() - found
                ),
            ));
        }
        let mut list = Vec::new();
        for file in manifests::manifest_files(base, current).await? {
            if !(file.has_added_files() || file.has_existing_files()) {
                continue;
            }
            let Some(keys) = hits.get_mut(file.manifest_path.as_str()) else {
                list.push(file);
                continue;
            };
            keys.sort();
            let cached = self
                .rewritten
                .get(&file.manifest_path)
                .filter(|(k, _)| k == keys)
                .map(|(_, m)| m.clone());
            let manifest = match cached {
                Some(m) => m,
                None => {
                    let m = self.rewrite(base, &file, keys).await?;
                    self.rewritten
                        .insert(file.manifest_path.clone(), (keys.clone(), m.clone()));
                    m
                }
            };
            list.push(manifest);
        }
        // The new files, one manifest per content type and spec.
        let mut groups: Vec<((ManifestContentType, i32), Vec<DataFile>)> = Vec::new();
        for (spec, file) in &plan.added {
            added.add(file);
            let content = match file.content_type() {
                DataContentType::Data => ManifestContentType::Data,
                _ => ManifestContentType::Deletes,
            };
            match groups.iter_mut().find(|(k, _)| *k == (content, *spec)) {
                Some((_, v)) => v.push(file.clone()),
                None => groups.push(((content, *spec), vec![file.clone()])),
            }
        }
        for ((content, spec_id), files) in groups {
            let keys: Vec<FileKey> = files.iter().map(FileKey::of).collect();
            if let Some((k, m)) = self.added.get(&(content, spec_id))
                && *k == keys
            {
                list.push(m.clone());
                continue;
            }
            let spec = snapshot::spec_of(metadata, spec_id)?;
            let path = self.path(base);
            let mut writer = snapshot::manifest_writer(
                base,
                &path,
                self.snapshot_id,
                metadata.current_schema().clone(),
                spec,
                content,
            )?;
            for file in files {
                writer.add_file(file, -1)?;
            }
            let m = writer.write_manifest_file().await?;
            self.added.insert((content, spec_id), (keys, m.clone()));
            list.push(m);
        }
        let mut props = properties.clone();
        props
            .extend(OffsetMap::carried_forward(metadata).map_err(|e| {
                iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e.to_string())
            })?);
        let summary = Summary {
            operation: Operation::Replace,
            additional_properties: snapshot::summary_properties(
                added,
                removed,
                Some(current.summary()),
                &props,
            ),
        };
        Ok(SnapshotParts {
            snapshot_id: self.snapshot_id,
            list_name: format!("{}-{attempt}", self.prefix),
            manifests: list,
            summary,
            new_schema: None,
        })
    }

    /// `file` with the entries `gone` marked deleted by this snapshot (a manifest of
    /// deleted entries only, when nothing stays).
    async fn rewrite(
        &mut self,
        base: &Table,
        file: &ManifestFile,
        gone: &[FileKey],
    ) -> iceberg::Result<ManifestFile> {
        let manifest = manifests::load(base, file).await?;
        let live = manifest.entries().iter().filter(|e| e.is_alive());
        let path = self.path(base);
        let mut writer = snapshot::manifest_writer(
            base,
            &path,
            self.snapshot_id,
            manifest.metadata().schema().clone(),
            manifest.metadata().partition_spec().clone(),
            file.content,
        )?;
        for entry in live {
            if gone.contains(&FileKey::of(entry.data_file())) {
                snapshot::add_deleted(&mut writer, entry)?;
            } else {
                snapshot::add_existing(&mut writer, entry)?;
            }
        }
        writer.write_manifest_file().await
    }
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
    let mut attempts = COMMIT_RETRY.start();
    loop {
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
        let Some(wait) = attempts.retry_after(error.class()) else {
            return Err(CommitFailure::Catalog {
                table: ident.to_string(),
                source: error,
            });
        };
        // A lost answer is harmless here: the updates are computed again from the table.
        tokio::time::sleep(wait).await;
        base = catalog
            .load_table(&ident)
            .await
            .map_err(|e| iceberg_failure(&ident, e))?;
    }
}
