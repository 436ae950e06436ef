//! Floe's own commit layer: snapshots with data files *and* delete files, committed with
//! the exactly-once check redone on every attempt.
//!
//! iceberg-rust 0.10 has no row-delta action and keeps its commit request type
//! crate-private, so this layer builds the snapshot from the crate's public pieces
//! (manifest writers, manifest-list writer, snapshot and metadata types) and commits it
//! through a [`CommitBackend`]: the SQL catalog's compare-and-swap or the REST catalog's
//! commit-table request.
//!
//! One commit:
//! 1. [`StagedSnapshot::write`] writes the manifests of the new files (once).
//! 2. [`commit`] checks the fence (the table still stores, for each partition this
//!    commit covers, the offset our records start from), writes a manifest list on top of
//!    the current `main`, and asks the backend to swap, requiring `main` to still point at
//!    that parent. The snapshot stores the offsets of every partition: ours updated,
//!    the others (other agents of the same pipeline) carried forward as found.
//! 3. On a conflict it waits (exponential backoff), reloads the table and starts again at
//!    2 — unless the caller needs the exact parent (upsert: its position deletes were
//!    computed against it) and the table's data changed meanwhile; then it returns
//!    [`CommitFailure::Stale`] so the caller can redo its deletes.
//! 4. When the outcome is unknown (a 5xx or a timeout), it reloads and looks for its own
//!    commit id in the snapshots before retrying, so a commit never lands twice.

pub mod manifests;
mod offsets;
mod rewrite;
mod snapshot;

use std::collections::HashMap;
use std::time::Duration;

use iceberg::spec::{Operation, Schema};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent, TableUpdate};

use crate::error::ErrorClass;
use crate::retry::{Policy, retry};

pub use crate::catalog::backend::{
    CommitBackend, CommitError, DELETE_AFTER_COMMIT, RestBackend, SqlBackend,
};
pub use offsets::{
    COMMIT_KEY, CREATED_BY_PROPERTY, GAP_KEY, OFFSETS_KEY, OFFSETS_PROPERTY_PREFIX, OffsetMap,
    OffsetsError, OffsetsSource, PIPELINE_KEY, PartitionMap, RESET_KEY, StoredOffsets,
    TopicPartition, WRITER_KEY,
};
pub use rewrite::{
    GiveUp, MAINTENANCE_KEY, Rewrite, RewriteOutcome, RewritePlan, commit_rewrite, commit_updates,
};
pub use snapshot::{SpecFile, StagedSnapshot};

/// A commit that keeps conflicting gives up after 12 attempts; a short wait spreads
/// writers that collided. Reloading the table after a failure uses it too.
pub(crate) const COMMIT_RETRY: Policy =
    Policy::backoff(Duration::from_millis(200), Duration::from_secs(5)).attempts(12);

/// What the table must still store for this pipeline for the commit to be valid.
#[derive(Debug, Clone)]
pub struct Fence {
    /// Pipeline name (offsets are stored per pipeline).
    pub pipeline: String,
    /// Per partition the commit covers: the offset its records start from (`None`: the
    /// table stores nothing for it yet). Other partitions are not checked.
    pub expected: crate::PartitionMap<Option<i64>>,
}

/// Why [`commit`] returned without committing.
#[derive(Debug, thiserror::Error)]
pub enum CommitFailure {
    /// Another writer committed offsets of this pipeline: our records may be duplicates.
    #[error(
        "fenced: another writer committed offsets of pipeline {pipeline:?} to {table} ({detail})"
    )]
    Fenced {
        /// Pipeline name.
        pipeline: String,
        /// Table identifier.
        table: String,
        /// The partitions whose offsets moved.
        detail: String,
    },
    /// Another writer changed the schema since ours was derived: the data files carry
    /// field ids that may now mean other columns, so the records must be re-read.
    #[error("the schema of {0} changed since this commit's schema was derived")]
    SchemaChanged(String),
    /// The table's data changed under a commit that needs its exact parent.
    #[error("table data changed since the commit was prepared")]
    Stale(Box<Table>),
    /// The catalog kept refusing or failed.
    #[error("commit to {table} failed: {source}")]
    Catalog {
        /// Table identifier.
        table: String,
        /// The last error.
        source: CommitError,
    },
    /// Reading the table or writing the manifest list failed.
    #[error("commit to {table} failed: {source}")]
    Iceberg {
        /// Table identifier.
        table: String,
        /// The cause.
        source: Box<iceberg::Error>,
    },
}

impl CommitFailure {
    /// Whether retrying the commit (after reloading the table) can help.
    pub fn class(&self) -> crate::error::ErrorClass {
        use crate::error::ErrorClass::*;
        match self {
            CommitFailure::Fenced { .. }
            | CommitFailure::SchemaChanged(_)
            | CommitFailure::Stale(_) => Transient,
            CommitFailure::Catalog { source, .. } => match source {
                CommitError::Failed(_) => Fatal,
                CommitError::Conflict(_) | CommitError::Unknown(_) => Transient,
            },
            CommitFailure::Iceberg { source, .. } => crate::error::iceberg_class(source),
        }
    }
}

/// Options of one commit.
pub struct CommitOptions<'a> {
    /// Summary properties (pipeline, writer id, commit id).
    pub properties: &'a HashMap<String, String>,
    /// The offsets this commit moves (the partitions it covers); stored together with
    /// the table's offsets of every other partition, as found at each attempt.
    pub offsets: &'a OffsetMap,
    /// A new current schema committed with the files.
    pub new_schema: Option<&'a Schema>,
    /// The table schema (id, last column id) the files were written against; `None`:
    /// the base's. A commit that carries a new schema is refused when the table's
    /// schema is no longer that one ([`CommitFailure::SchemaChanged`]).
    pub written_on: Option<(i32, i32)>,
    /// The exactly-once check.
    pub fence: &'a Fence,
    /// Return [`CommitFailure::Stale`] instead of rebasing when the table's data changed.
    pub exact_parent: bool,
}

/// A commit that landed.
#[derive(Debug)]
pub struct Committed {
    /// The table as the catalog returned it (after a lost answer, as reloaded: it may
    /// hold later snapshots of other writers on top of ours).
    pub table: Table,
    /// The id of the snapshot this commit added.
    pub snapshot_id: i64,
}

// upstream: row-delta commits (iceberg-rust 0.10 has no RowDelta/overwrite action that
// adds data and delete files in one snapshot, and no fence precondition on it; delete
// when it has both)
/// Commits `staged` on top of `base` (see the module docs).
pub async fn commit(
    catalog: &dyn Catalog,
    backend: &dyn CommitBackend,
    mut base: Table,
    staged: &mut StagedSnapshot,
    options: CommitOptions<'_>,
) -> Result<Committed, CommitFailure> {
    let ident = base.identifier().clone();
    let prepared_on = base.metadata().current_snapshot_id();
    let prepared_schema = options.written_on.unwrap_or((
        base.metadata().current_schema_id(),
        base.metadata().last_column_id(),
    ));
    let commit_id = options.properties.get(COMMIT_KEY).cloned();
    let snapshot_id = staged.snapshot_id();
    let mut attempts = COMMIT_RETRY.start();
    loop {
        let found = check_fence(&base, options.fence)?;
        let mut properties = options.properties.clone();
        let stored = found.merged(options.offsets);
        properties.insert(OFFSETS_KEY.to_string(), stored.to_summary_value());
        let schema_now = (
            base.metadata().current_schema_id(),
            base.metadata().last_column_id(),
        );
        if options.new_schema.is_some() && schema_now != prepared_schema {
            return Err(CommitFailure::SchemaChanged(ident.to_string()));
        }
        if options.exact_parent && data_changed_since(&base, prepared_on) {
            return Err(CommitFailure::Stale(Box::new(base)));
        }
        let prepared = staged.updates(&base, &properties, options.new_schema).await;
        let (requirements, mut updates) = match prepared {
            Ok(prepared) => prepared,
            // The base names files that are gone (another writer expired its snapshots)
            // or no longer lists files this commit removes: it is stale.
            Err(e) if snapshot::removes_files_not_live(&e) && options.exact_parent => {
                return Err(CommitFailure::Stale(Box::new(
                    reload(catalog, &ident).await?,
                )));
            }
            Err(e) if crate::error::is_missing_file(&e) => {
                // Nothing outside failed: reload at once.
                if attempts.retry_after(ErrorClass::Transient).is_none() {
                    return Err(iceberg_failure(&ident, e));
                }
                tracing::info!(table = %ident, attempt = attempts.failures(), error = %e, "the table view is stale (a file of it is gone): reloading");
                base = reload(catalog, &ident).await?;
                if options.exact_parent && data_changed_since(&base, prepared_on) {
                    return Err(CommitFailure::Stale(Box::new(base)));
                }
                continue;
            }
            Err(e) => return Err(iceberg_failure(&ident, e)),
        };
        // The same offsets in a table property, which snapshot expiry cannot remove.
        updates.push(offsets_property(
            &options.fence.pipeline,
            snapshot_id,
            stored,
        ));
        let error = match backend.commit(&base, requirements, updates).await {
            Ok(table) => return Ok(Committed { table, snapshot_id }),
            Err(e) => e,
        };
        let unknown = matches!(error, CommitError::Unknown(_));
        let Some(wait) = attempts.retry_after(error.class()) else {
            return Err(CommitFailure::Catalog {
                table: ident.to_string(),
                source: error,
            });
        };
        match &error {
            // Another writer (a compaction, another agent) committed first: routine.
            CommitError::Conflict(_) if attempts.failures() <= 3 => {
                tracing::info!(table = %ident, attempt = attempts.failures(), %error, "another writer committed first; reloading the table and committing again")
            }
            _ => {
                tracing::warn!(table = %ident, attempt = attempts.failures(), %error, "commit did not land; reloading the table")
            }
        }
        if let Some(p) = options.properties.get(crate::commit::PIPELINE_KEY) {
            metrics::counter!(crate::COMMIT_RETRIES, "pipeline" => p.to_string()).increment(1);
        }
        tokio::time::sleep(wait).await;
        base = reload(catalog, &ident).await?;
        if unknown
            && let Some(id) = &commit_id
            && contains_commit(&base, id)
        {
            tracing::info!(table = %ident, commit_id = %id, "commit had landed after all");
            return Ok(Committed {
                table: base,
                snapshot_id,
            });
        }
    }
}

/// The update setting `floe.offsets.<pipeline>` to `offsets`, committed by `snapshot_id`.
fn offsets_property(pipeline: &str, snapshot_id: i64, offsets: OffsetMap) -> TableUpdate {
    TableUpdate::SetProperties {
        updates: HashMap::from([(
            StoredOffsets::property_key(pipeline),
            StoredOffsets {
                snapshot_id,
                offsets,
            }
            .to_property_value(),
        )]),
    }
}

/// Loads the table after a failed attempt; a transient failure of the load itself (the
/// catalog answering 5xx or 429 right after a conflict) is retried with backoff.
async fn reload(catalog: &dyn Catalog, ident: &TableIdent) -> Result<Table, CommitFailure> {
    let class = |e: &iceberg::Error| match crate::catalog::is_not_found(e) {
        true => ErrorClass::Fatal,
        false => crate::error::iceberg_class(e),
    };
    retry(
        COMMIT_RETRY,
        || catalog.load_table(ident),
        class,
        |e, attempt, _| tracing::warn!(table = %ident, attempt, error = %e, "loading the table after a failed commit failed: retrying"),
    )
    .await
    .map_err(|e| iceberg_failure(ident, e))
}

/// Checks the covered partitions; returns every offset the table stores for the pipeline.
fn check_fence(table: &Table, fence: &Fence) -> Result<OffsetMap, CommitFailure> {
    let found = OffsetMap::from_table(table.metadata(), &fence.pipeline).map_err(|e| {
        iceberg_failure(
            table.identifier(),
            iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e.to_string()),
        )
    })?;
    let moved: Vec<String> = fence
        .expected
        .iter()
        .filter(|(tp, expected)| found.0.get(*tp) != expected.as_ref())
        .map(|((topic, partition), expected)| {
            let show = |o: Option<&i64>| o.map_or("none".to_string(), |o| o.to_string());
            format!(
                "{topic}/{partition}: table has {}, this writer expected {}",
                show(found.0.get(&(topic.clone(), *partition))),
                show(expected.as_ref())
            )
        })
        .collect();
    if !moved.is_empty() {
        return Err(CommitFailure::Fenced {
            pipeline: fence.pipeline.clone(),
            table: table.identifier().to_string(),
            detail: moved.join("; "),
        });
    }
    Ok(found)
}

/// Whether a snapshot after `since` on `main` added or removed files.
fn data_changed_since(table: &Table, since: Option<i64>) -> bool {
    let metadata = table.metadata();
    let mut current = metadata.current_snapshot();
    while let Some(snapshot) = current {
        if Some(snapshot.snapshot_id()) == since {
            return false;
        }
        let summary = snapshot.summary();
        let count = |key: &str| {
            summary
                .additional_properties
                .get(key)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let changed = summary.operation != Operation::Append
            || [
                "added-data-files",
                "added-delete-files",
                "deleted-data-files",
                "removed-delete-files",
            ]
            .iter()
            .any(|k| count(k) > 0);
        if changed {
            return true;
        }
        current = snapshot
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    // Reached the start of `main`: everything was checked if the commit was prepared on
    // an empty table; otherwise `since` left the lineage (a rollback), so assume changed.
    since.is_some()
}

fn contains_commit(table: &Table, commit_id: &str) -> bool {
    table.metadata().snapshots().any(|s| {
        s.summary()
            .additional_properties
            .get(COMMIT_KEY)
            .map(String::as_str)
            == Some(commit_id)
    })
}

fn iceberg_failure(ident: &TableIdent, e: iceberg::Error) -> CommitFailure {
    CommitFailure::Iceberg {
        table: ident.to_string(),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    //! The commit loop against a real SQLite catalog; only the lost answer (a fault a
    //! real catalog cannot be made to produce on demand) is injected.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use iceberg::spec::{NestedField, PrimitiveType, Type};
    use iceberg::{NamespaceIdent, TableCreation, TableRequirement, TableUpdate};

    use super::*;
    use crate::catalog::{CatalogConfig, CatalogHandle, open_catalog};

    /// Passes commits to the real backend but reports the first one as "unknown",
    /// either after applying it (`apply_first`) or without sending it.
    #[derive(Debug)]
    struct LostAnswer {
        inner: Arc<dyn CommitBackend>,
        apply_first: bool,
        calls: AtomicU32,
    }

    #[async_trait]
    impl CommitBackend for LostAnswer {
        async fn commit(
            &self,
            base: &Table,
            requirements: Vec<TableRequirement>,
            updates: Vec<TableUpdate>,
        ) -> Result<Table, CommitError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                if self.apply_first {
                    self.inner.commit(base, requirements, updates).await?;
                }
                return Err(CommitError::Unknown("connection reset".into()));
            }
            self.inner.commit(base, requirements, updates).await
        }
    }

    async fn table(dir: &std::path::Path) -> (CatalogHandle, Table) {
        let handle = open_catalog(
            "local",
            &CatalogConfig::embedded(dir.join("catalog.db"), dir.join("warehouse")),
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
        let table = handle.catalog.create_table(&ns, creation).await.unwrap();
        (handle, table)
    }

    fn props(pipeline: &str) -> HashMap<String, String> {
        HashMap::from([
            (PIPELINE_KEY.to_string(), pipeline.to_string()),
            (COMMIT_KEY.to_string(), uuid::Uuid::now_v7().to_string()),
        ])
    }

    fn offsets(partitions: &[(i32, i64)]) -> OffsetMap {
        let mut m = OffsetMap::default();
        for (p, o) in partitions {
            m.0.insert((Arc::from("topic"), *p), *o);
        }
        m
    }

    fn fence(pipeline: &str, expected: &[(i32, Option<i64>)]) -> Fence {
        Fence {
            pipeline: pipeline.into(),
            expected: expected
                .iter()
                .map(|(p, o)| ((Arc::from("topic"), *p), *o))
                .collect(),
        }
    }

    async fn load(handle: &CatalogHandle) -> Table {
        handle
            .catalog
            .load_table(&TableIdent::from_strs(["ns", "t"]).unwrap())
            .await
            .unwrap()
    }

    /// Commits an empty snapshot of `pipeline` moving `moves` from `expected`, on `base`.
    async fn commit_on(
        handle: &CatalogHandle,
        backend: &dyn CommitBackend,
        base: Table,
        pipeline: &str,
        expected: &[(i32, Option<i64>)],
        moves: &[(i32, i64)],
    ) -> Result<Table, CommitFailure> {
        let mut staged = StagedSnapshot::write(&base, None, Vec::new(), Vec::new())
            .await
            .unwrap();
        let properties = props(pipeline);
        commit(
            handle.catalog.as_ref(),
            backend,
            base,
            &mut staged,
            CommitOptions {
                properties: &properties,
                offsets: &offsets(moves),
                new_schema: None,
                written_on: None,
                fence: &fence(pipeline, expected),
                exact_parent: false,
            },
        )
        .await
        .map(|c| c.table)
    }

    async fn commit_once(
        handle: &CatalogHandle,
        backend: &dyn CommitBackend,
    ) -> Result<Table, CommitFailure> {
        let base = load(handle).await;
        commit_on(handle, backend, base, "p", &[(0, None)], &[(0, 10)]).await
    }

    /// Orphan cleanup lists the files before it reads which ones the table references:
    /// a commit that lands between the two must keep its files (here it lands inside
    /// the reload, which still returns the view from before it).
    #[tokio::test]
    async fn orphan_cleanup_keeps_the_files_of_a_commit_after_its_listing() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _) = table(dir.path()).await;
        let backend = handle.committer.clone();
        let current = commit_once(&handle, backend.as_ref()).await.unwrap();
        let reload = || async {
            let before = load(&handle).await;
            commit_on(
                &handle,
                backend.as_ref(),
                before.clone(),
                "p",
                &[(0, Some(10))],
                &[(0, 20)],
            )
            .await
            .unwrap();
            Ok(before)
        };
        crate::orphans::remove_orphans(&current, reload, std::time::Duration::ZERO, false)
            .await
            .unwrap();
        let after = load(&handle).await;
        let local = |path: &str| std::path::PathBuf::from(path.trim_start_matches("file://"));
        let metadata = after.metadata_location().unwrap();
        assert!(
            local(metadata).exists(),
            "the new metadata file was deleted"
        );
        let list = after.metadata().current_snapshot().unwrap().manifest_list();
        assert!(local(list).exists(), "the new manifest list was deleted");
    }

    #[tokio::test]
    async fn an_unknown_outcome_that_landed_is_found_and_not_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _) = table(dir.path()).await;
        let backend = LostAnswer {
            inner: handle.committer.clone(),
            apply_first: true,
            calls: AtomicU32::new(0),
        };
        let committed = commit_once(&handle, &backend).await.unwrap();
        assert_eq!(
            committed.metadata().snapshots().count(),
            1,
            "one snapshot, not two"
        );
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1, "no second attempt");
    }

    #[tokio::test]
    async fn an_unknown_outcome_that_did_not_land_is_retried_once() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _) = table(dir.path()).await;
        let backend = LostAnswer {
            inner: handle.committer.clone(),
            apply_first: false,
            calls: AtomicU32::new(0),
        };
        let committed = commit_once(&handle, &backend).await.unwrap();
        assert_eq!(committed.metadata().snapshots().count(), 1);
        assert_eq!(backend.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_conflict_is_rebased_and_a_moved_offset_is_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, stale) = table(dir.path()).await;
        let backend = handle.committer.clone();
        // Another pipeline commits first: ours rebases onto it.
        commit_on(
            &handle,
            backend.as_ref(),
            stale.clone(),
            "other",
            &[(0, None)],
            &[(0, 5)],
        )
        .await
        .unwrap();
        let t = commit_on(
            &handle,
            backend.as_ref(),
            stale.clone(),
            "p",
            &[(0, None)],
            &[(0, 10)],
        )
        .await
        .unwrap();
        assert_eq!(
            t.metadata().snapshots().count(),
            2,
            "rebased on the other writer's snapshot"
        );
        // A zombie of pipeline `p` that still expects no offsets for partition 0 is refused.
        let e = commit_on(
            &handle,
            backend.as_ref(),
            stale,
            "p",
            &[(0, None)],
            &[(0, 7)],
        )
        .await
        .unwrap_err();
        assert!(matches!(e, CommitFailure::Fenced { .. }), "{e}");
        assert!(e.to_string().contains("topic/0: table has 10"), "{e}");
    }

    #[tokio::test]
    async fn agents_of_one_pipeline_share_a_table_partition_by_partition() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, stale) = table(dir.path()).await;
        let backend = handle.committer.clone();
        // Agent A owns partition 0, agent B partition 1; both prepared on the same base.
        commit_on(
            &handle,
            backend.as_ref(),
            stale.clone(),
            "p",
            &[(0, None)],
            &[(0, 10)],
        )
        .await
        .unwrap();
        let t = commit_on(
            &handle,
            backend.as_ref(),
            stale.clone(),
            "p",
            &[(1, None)],
            &[(1, 20)],
        )
        .await
        .expect("a commit on another partition is not fenced");
        let stored = OffsetMap::from_table(t.metadata(), "p").unwrap();
        assert_eq!(
            stored,
            offsets(&[(0, 10), (1, 20)]),
            "A's offsets carried forward by B"
        );
        // A goes on from 10; B's zombie twin (still at none for 1) is refused.
        let t = commit_on(
            &handle,
            backend.as_ref(),
            load(&handle).await,
            "p",
            &[(0, Some(10))],
            &[(0, 15)],
        )
        .await
        .unwrap();
        assert_eq!(
            OffsetMap::from_table(t.metadata(), "p").unwrap(),
            offsets(&[(0, 15), (1, 20)])
        );
        let e = commit_on(
            &handle,
            backend.as_ref(),
            stale,
            "p",
            &[(1, None)],
            &[(1, 25)],
        )
        .await
        .unwrap_err();
        assert!(matches!(e, CommitFailure::Fenced { .. }), "{e}");
    }

    /// A snapshot of no pipeline (another engine's append), on the current table.
    async fn foreign_commit(handle: &CatalogHandle) -> Table {
        let base = load(handle).await;
        let mut staged = StagedSnapshot::write(&base, None, Vec::new(), Vec::new())
            .await
            .unwrap();
        let (requirements, updates) = staged.updates(&base, &HashMap::new(), None).await.unwrap();
        handle
            .committer
            .commit(&base, requirements, updates)
            .await
            .unwrap()
    }

    /// Removes every snapshot but the current one, as another engine's expiry would.
    async fn expire_all_but_current(handle: &CatalogHandle) -> Table {
        let base = load(handle).await;
        let current = base.metadata().current_snapshot_id();
        let ids: Vec<i64> = base
            .metadata()
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| Some(*id) != current)
            .collect();
        handle
            .committer
            .commit(
                &base,
                Vec::new(),
                vec![TableUpdate::RemoveSnapshots { snapshot_ids: ids }],
            )
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn offsets_survive_foreign_commits_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _) = table(dir.path()).await;
        let backend = handle.committer.clone();
        let t = commit_on(
            &handle,
            backend.as_ref(),
            load(&handle).await,
            "p",
            &[(0, None), (1, None)],
            &[(0, 10), (1, 4)],
        )
        .await
        .unwrap();
        let ours = t.metadata().current_snapshot_id().unwrap();
        foreign_commit(&handle).await;
        foreign_commit(&handle).await;
        let t = expire_all_but_current(&handle).await;
        assert!(
            t.metadata().snapshot_by_id(ours).is_none(),
            "our snapshot is gone"
        );
        let (found, source) = OffsetMap::located(t.metadata(), "p").unwrap();
        assert_eq!(found, offsets(&[(0, 10), (1, 4)]));
        assert_eq!(source, OffsetsSource::Property(ours));
        assert_eq!(
            OffsetMap::from_table(t.metadata(), "other").unwrap(),
            OffsetMap::default()
        );
        // The pipeline goes on from what the property says: the fence accepts it.
        let t = commit_on(
            &handle,
            backend.as_ref(),
            t,
            "p",
            &[(0, Some(10))],
            &[(0, 12)],
        )
        .await
        .unwrap();
        assert_eq!(
            OffsetMap::from_table(t.metadata(), "p").unwrap(),
            offsets(&[(0, 12), (1, 4)]),
            "partition 1 carried forward from the property"
        );
    }

    #[tokio::test]
    async fn the_lineage_wins_over_the_property_after_a_rollback() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _) = table(dir.path()).await;
        let backend = handle.committer.clone();
        let first = commit_on(
            &handle,
            backend.as_ref(),
            load(&handle).await,
            "p",
            &[(0, None)],
            &[(0, 10)],
        )
        .await
        .unwrap();
        let first_id = first.metadata().current_snapshot_id().unwrap();
        commit_on(
            &handle,
            backend.as_ref(),
            first,
            "p",
            &[(0, Some(10))],
            &[(0, 20)],
        )
        .await
        .unwrap();
        // Roll `main` back to the first commit: its data is what the table holds.
        let base = load(&handle).await;
        let rolled = handle
            .committer
            .commit(
                &base,
                Vec::new(),
                vec![TableUpdate::SetSnapshotRef {
                    ref_name: iceberg::spec::MAIN_BRANCH.to_string(),
                    reference: iceberg::spec::SnapshotReference::new(
                        first_id,
                        iceberg::spec::SnapshotRetention::branch(None, None, None),
                    ),
                }],
            )
            .await
            .unwrap();
        assert_eq!(
            OffsetMap::located(rolled.metadata(), "p").unwrap(),
            (offsets(&[(0, 10)]), OffsetsSource::Snapshot(first_id))
        );
    }
}
