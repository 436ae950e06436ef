//! The target table: load or create, evolve the schema, stream rows into data files,
//! commit them.
//!
//! Rows arrive in chunks ([`TableSink::write_rows`]) and stream into open files
//! ([`super::stream`]). A *generation* is what one commit adds: [`TableSink::cut`]
//! closes the open files at the end of a commit interval, and [`TableSink::commit`]
//! commits every generation cut since the last commit (several after a catalog outage)
//! as one snapshot. In upsert mode each generation keeps an [`Overlay`] of the keys it
//! wrote; deletes of committed rows are computed at commit time from the key index,
//! caught up to the exact parent the snapshot commits on.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use iceberg::spec::{DataFile, FormatVersion, Schema, Struct};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};
use uuid::Uuid;

use super::stream::{OpenFiles, RowPlace, StreamLimits};
use super::upsert::{
    self, DeleteTarget, IndexSettings, KeyHash, KeyIndex, KeySpec, OP_COLUMN, Overlay, Plan,
    RebuildStats,
};
use super::{Mode, SinkConfig, SinkError, partition};
use crate::batch::{self, Buffered};
use crate::record::PartitionMap;
use crate::schema::SchemaTracker;
use floe_iceberg::CatalogHandle;
use floe_iceberg::retry::Policy;
use floe_iceberg::{
    self as commit, CommitFailure, CommitOptions, Committed, Fence, StagedSnapshot,
};
use floe_iceberg::{COMMIT_KEY, ErrorClass, OffsetMap, PIPELINE_KEY, WRITER_KEY};

/// Times a commit whose deletes went stale (other writers keep committing) is redone
/// before it is given up on (a transient failure: the committer retries the seal).
const MAX_REBASES: u32 = 20;
/// Redoing a stale commit, or reading a stale table view again, waits for nothing: the
/// table is reloaded at once.
const REBASE_RETRY: Policy = Policy::immediate().attempts(MAX_REBASES + 1);

/// One pipeline's view of its target table.
pub struct TableSink {
    catalog: CatalogHandle,
    ident: TableIdent,
    table: Option<Table>,
    config: SinkConfig,
    pipeline: String,
    writer_id: String,
    upsert: Option<UpsertState>,
    /// The generation being written: its open files, the files it closed, its overlay.
    current: Option<Current>,
    /// Generations cut and not committed yet, oldest first.
    cut: Vec<Generation>,
    /// The schema the uncommitted files' commit sets, when it adds to the table's.
    pending_schema: Option<Schema>,
    /// The table schema (id, last column id) `pending_schema` was derived from.
    written_on: Option<(i32, i32)>,
}

/// Upsert mode's key and index (rebuilt from the table when missing).
struct UpsertState {
    spec: KeySpec,
    index: Option<KeyIndex>,
    settings: IndexSettings,
}

/// The generation being written.
struct Current {
    files: OpenFiles,
    /// Files it closed already (a schema change, a partition past `max_open_files`).
    closed: Vec<DataFile>,
    overlay: Overlay,
}

/// Files one commit adds (a commit interval's worth), with the keys they wrote.
#[derive(Default)]
struct Generation {
    /// Data files with the id of the partition spec they were written in.
    files: Vec<(i32, DataFile)>,
    overlay: Overlay,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The new snapshot.
    pub snapshot_id: i64,
    /// Data files it added (0 for a snapshot that only moves offsets).
    pub files: usize,
    /// Delete files it added (upsert mode).
    pub delete_files: usize,
    /// Bytes of the data files it added.
    pub bytes: u64,
}

impl TableSink {
    /// Loads the table `table` of the sink's namespace (or remembers to create it on the
    /// first commit, if allowed).
    pub async fn open(
        catalog: &CatalogHandle,
        config: &SinkConfig,
        table: &str,
        pipeline: &str,
        writer_id: &str,
    ) -> Result<TableSink, SinkError> {
        let namespace =
            NamespaceIdent::from_vec(config.namespace.split('.').map(str::to_string).collect())
                .map_err(|e| SinkError::Iceberg {
                    operation: "parse namespace",
                    table: config.namespace.clone(),
                    source: Box::new(e),
                })?;
        let ident = TableIdent::new(namespace, table.to_string());
        let mut sink = TableSink {
            catalog: catalog.clone(),
            ident,
            table: None,
            config: config.clone(),
            pipeline: pipeline.to_string(),
            writer_id: writer_id.to_string(),
            upsert: (config.mode == Mode::Upsert).then(|| UpsertState {
                spec: KeySpec::from_config(&config.key),
                index: None,
                settings: IndexSettings {
                    memory: config.index_memory,
                    dir: Some(config.index_dir.join(pipeline)),
                    max_keys: config.max_keys,
                },
            }),
            current: None,
            cut: Vec::new(),
            pending_schema: None,
            written_on: None,
        };
        sink.reload().await?;
        if sink.table.is_none() && !config.create_table {
            return Err(SinkError::MissingTable(sink.ident.to_string()));
        }
        if let Some(table) = &sink.table {
            partition::check_table(table.metadata())
                .map_err(|m| SinkError::Unwritable(format!("{}: {m}", sink.ident)))?;
        }
        if let (Some(table), Some(u)) = (&sink.table, &sink.upsert) {
            upsert::check_table(table.metadata(), &u.spec)?;
            sink.ensure_index().await?;
        }
        Ok(sink)
    }

    /// Upsert mode: the key of this table's rows.
    pub fn key_spec(&self) -> Option<&KeySpec> {
        self.upsert.as_ref().map(|u| &u.spec)
    }

    /// Opens the upsert index (kept on disk and caught up, or rebuilt from the table) if
    /// it is not there. A file of the table view that is gone (another writer's expiry)
    /// means the view is stale: reload and read again.
    async fn ensure_index(&mut self) -> Result<(), SinkError> {
        let mut attempts = REBASE_RETRY.start();
        loop {
            let (Some(table), Some(u)) = (&self.table, &mut self.upsert) else {
                return Ok(());
            };
            if u.index.is_some() {
                return Ok(());
            }
            let started = std::time::Instant::now();
            match KeyIndex::open(table, &u.spec, &u.settings).await {
                Ok((index, stats)) => {
                    log_index(&self.pipeline, &self.ident, &stats, started);
                    u.index = Some(index);
                    return Ok(());
                }
                Err(e) => {
                    let e = SinkError::from(e);
                    let class = match e.is_missing_file() {
                        true => ErrorClass::Transient,
                        false => ErrorClass::Fatal,
                    };
                    if attempts.retry_after(class).is_none() {
                        return Err(e);
                    }
                    tracing::info!(pipeline = %self.pipeline, table = %self.ident, error = %e, "the table view is stale (a file of it is gone): reloading");
                    self.reload().await?;
                }
            }
        }
    }

    /// Keeps the upsert index on disk for the next start (a clean stop).
    pub async fn close(&mut self) -> Result<(), SinkError> {
        if let Some(index) = self.upsert.as_mut().and_then(|u| u.index.as_mut()) {
            index.persist().await?;
        }
        Ok(())
    }

    /// Whether the table exists in the catalog.
    pub fn exists(&self) -> bool {
        self.table.is_some()
    }

    /// The table identifier.
    pub fn ident(&self) -> &TableIdent {
        &self.ident
    }

    /// Reads the table again from the catalog. The upsert index is kept: it knows the
    /// snapshot it reflects and catches up with the table (or is rebuilt) before it is
    /// next used.
    pub async fn reload(&mut self) -> Result<(), SinkError> {
        self.table = match self.catalog.catalog.load_table(&self.ident).await {
            Ok(t) => Some(t),
            Err(e) if floe_iceberg::is_not_found(&e) => None,
            Err(e) => return Err(self.err("load table", e)),
        };
        if self.table.is_none()
            && let Some(u) = &mut self.upsert
        {
            u.index = None;
        }
        Ok(())
    }

    /// The table's current schema, if it exists.
    pub fn current_schema(&self) -> Option<Arc<Schema>> {
        self.table
            .as_ref()
            .map(|t| t.metadata().current_schema().clone())
    }

    /// A schema tracker starting from the table's current columns.
    pub fn tracker(&self) -> SchemaTracker {
        match &self.table {
            Some(t) => SchemaTracker::from_table(t.metadata().current_schema()),
            None => SchemaTracker::new(),
        }
    }

    /// The offsets the table stores for this pipeline.
    pub fn stored_offsets(&self) -> Result<OffsetMap, SinkError> {
        match &self.table {
            Some(t) => Ok(OffsetMap::from_table(t.metadata(), &self.pipeline)?),
            None => Ok(OffsetMap::default()),
        }
    }

    /// Creates the table if it does not exist (returns true when it did). A new table
    /// starts with a snapshot carrying `initial` offsets (the pipeline's position before
    /// the records that made it), so that a crash before its first data commit makes the
    /// pipeline read that data again.
    pub async fn ensure_table(
        &mut self,
        tracker: &SchemaTracker,
        initial: &OffsetMap,
    ) -> Result<bool, SinkError> {
        if self.table.is_some() {
            return Ok(false);
        }
        self.create(tracker).await?;
        let expected = initial.0.keys().map(|tp| (tp.clone(), None)).collect();
        let mut nothing = Vec::new();
        let give_up = std::pin::pin!(tokio::time::sleep(crate::sink::COMMIT_ATTEMPT_TIMEOUT));
        self.commit_generations(&mut nothing, &expected, initial, HashMap::new(), give_up)
            .await?;
        Ok(true)
    }

    /// The schema rows admitted by `tracker` are written with, derived from `base` (the
    /// schema of the uncommitted files, or the table's): `Some` when it changes. Rows
    /// admitted against columns another writer has since given an incompatible type
    /// cannot be written without loss: that is [`SinkError::Fenced`], and the pipeline
    /// reads them again against the table.
    fn evolve(
        &self,
        table: &Table,
        base: &Schema,
        tracker: &SchemaTracker,
    ) -> Result<Option<Schema>, SinkError> {
        if let Some(conflict) = tracker
            .conflict_with(table.metadata().current_schema())
            .or_else(|| tracker.conflict_with(base))
        {
            return Err(SinkError::Fenced(format!(
                "the schema of {} changed under buffered rows ({conflict}); re-reading them against the table's schema",
                self.ident
            )));
        }
        // New ids go above every id the table ever assigned and every id written.
        let last = table
            .metadata()
            .last_column_id()
            .max(base.highest_field_id());
        let next = tracker.evolved_schema(base, last)?;
        if let Some(next) = &next {
            let changed: Vec<String> = next
                .field_id_to_name_map()
                .iter()
                .filter(|(id, _)| {
                    base.field_by_id(**id).map(|f| &f.field_type)
                        != next.field_by_id(**id).map(|f| &f.field_type)
                })
                .map(|(_, name)| name.clone())
                .collect();
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, columns = ?changed, "schema changes with the next commit");
        }
        Ok(next)
    }

    /// Whether rows were written since the last commit.
    pub fn has_uncommitted(&self) -> bool {
        self.current.is_some() || !self.cut.is_empty()
    }

    /// Files closed early because too many were open (for the metric), reset.
    pub fn take_closed_early(&mut self) -> u64 {
        self.current
            .as_mut()
            .map_or(0, |c| std::mem::take(&mut c.files.closed_early))
    }

    /// Streams buffered rows into the open files of this generation, in the schema the
    /// next commit sets (the table's, plus what `tracker` learned: derived from the
    /// uncommitted files' schema, so field ids never change under written files). In
    /// upsert mode only the last row per key of the chunk is written (none for a
    /// tombstone); the rows they replace are deleted at commit. Encoding runs on a
    /// blocking thread, off the async workers.
    pub async fn write_rows(
        &mut self,
        buffered: &Buffered,
        tracker: &SchemaTracker,
    ) -> Result<(), SinkError> {
        if buffered.rows == 0 {
            return Ok(());
        }
        let table = self
            .table
            .clone()
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        let base = match &self.pending_schema {
            Some(s) => Arc::new(s.clone()),
            None => table.metadata().current_schema().clone(),
        };
        let evolved = self.evolve(&table, &base, tracker)?;
        let schema = match &evolved {
            Some(next) => {
                self.written_on.get_or_insert((
                    table.metadata().current_schema_id(),
                    table.metadata().last_column_id(),
                ));
                self.pending_schema = Some(next.clone());
                Arc::new(next.clone())
            }
            None => base,
        };
        let limits = StreamLimits {
            target_file_size: self.config.target_file_size,
            row_group_bytes: self.config.row_group_bytes,
            max_open_files: self.config.max_open_files,
        };
        // Open files keep one schema: a new one closes them first.
        let mut current = match self.current.take() {
            Some(mut c) if c.files.schema().as_struct() != schema.as_struct() => {
                c.files
                    .close_all()
                    .await
                    .map_err(|e| self.err("write", e))?;
                c.closed.extend(c.files.take_closed());
                c.files = OpenFiles::new(&table, schema.clone(), &self.pipeline, limits)
                    .map_err(|e| self.err("write", e))?;
                c
            }
            Some(c) => c,
            None => Current {
                files: OpenFiles::new(&table, schema.clone(), &self.pipeline, limits)
                    .map_err(|e| self.err("write", e))?,
                closed: Vec::new(),
                overlay: Overlay::default(),
            },
        };
        let plan = match &self.upsert {
            None => None,
            Some(_) => {
                self.ensure_index().await?;
                let exists = |keys: &[KeyHash]| self.keys_live(&current.overlay, keys);
                let plan = match Plan::new(&buffered.keys, exists) {
                    Err(e) if e.is_index_damage() => {
                        // Once: a rebuilt index that is damaged again is an error.
                        self.drop_damaged_index(&e);
                        self.ensure_index().await?;
                        let exists = |keys: &[KeyHash]| self.keys_live(&current.overlay, keys);
                        Plan::new(&buffered.keys, exists)
                    }
                    other => other,
                };
                Some(plan?)
            }
        };
        let handle = tokio::runtime::Handle::current();
        let batches = buffered.batches.clone();
        let ident = self.ident.to_string();
        let (files, written) = tokio::task::spawn_blocking(move || {
            let mut files = current.files;
            let result = (|| {
                let arrow = files.arrow_schema().clone();
                let mut conformed = Vec::with_capacity(batches.len());
                for b in &batches {
                    conformed.push(batch::conform(b, &arrow).map_err(batch::BatchError::from)?);
                }
                if let Some(plan) = &plan {
                    conformed = apply_plan(conformed, plan)?;
                }
                let mut places = plan.as_ref().map(|_| Vec::new());
                for b in conformed {
                    handle
                        .block_on(files.write(b, places.as_mut()))
                        .map_err(|e| SinkError::Iceberg {
                            operation: "write",
                            table: ident.clone(),
                            source: Box::new(e),
                        })?;
                }
                Ok::<_, SinkError>((plan, places))
            })();
            current.files = files;
            (current, result)
        })
        .await
        .map_err(|e| SinkError::Internal(format!("writer thread: {e}")))?;
        let mut current = files;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                // The open files may be broken mid-row-group: this generation is dropped
                // and its records read again (the caller rewinds).
                self.discard();
                return Err(e);
            }
        };
        if let (Some(plan), Some(places)) = written {
            self.record_writes(&mut current.overlay, &plan, places)?;
        }
        self.current = Some(current);
        Ok(())
    }

    /// Per key, whether it has a live row: in the uncommitted generations, else in the
    /// table. The keys the generations do not decide go to the index in one batch.
    fn keys_live(
        &self,
        current: &Overlay,
        keys: &[KeyHash],
    ) -> Result<Vec<bool>, upsert::UpsertError> {
        let mut live = Vec::with_capacity(keys.len());
        let mut undecided = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.uncommitted_row(current, key) {
                Some(row) => live.push(row.is_some()),
                None => {
                    live.push(false);
                    undecided.push(i);
                }
            }
        }
        if let Some(index) = self.upsert.as_ref().and_then(|u| u.index.as_ref())
            && !undecided.is_empty()
        {
            let asked: Vec<KeyHash> = undecided.iter().map(|&i| keys[i]).collect();
            for (i, row) in undecided.into_iter().zip(index.get_many(&asked)?) {
                live[i] = row.is_some();
            }
        }
        Ok(live)
    }

    /// `key`'s newest row in the uncommitted generations: `Some(None)` for a tombstone,
    /// `None` when they did not write it.
    fn uncommitted_row(&self, current: &Overlay, key: &KeyHash) -> Option<Option<RowPlace>> {
        std::iter::once(current)
            .chain(self.cut.iter().rev().map(|g| &g.overlay))
            .find_map(|o| o.get(key))
    }

    /// Records in `overlay` where a chunk's rows went and which uncommitted rows they
    /// replace.
    fn record_writes(
        &self,
        overlay: &mut Overlay,
        plan: &Plan,
        places: Vec<RowPlace>,
    ) -> Result<(), SinkError> {
        if places.len() != plan.row_keys.len() {
            return Err(SinkError::Internal(format!(
                "{} rows placed, {} written",
                places.len(),
                plan.row_keys.len()
            )));
        }
        // Keys are digests already: a fast hasher, not SipHash, for a map built per chunk.
        let written: HashMap<KeyHash, RowPlace, foldhash::fast::RandomState> =
            plan.row_keys.iter().copied().zip(places).collect();
        for key in &plan.touched {
            if let Some(place) = self.uncommitted_row(overlay, key).flatten() {
                overlay.supersede(&place)?;
            }
            overlay.insert(*key, written.get(key))?;
        }
        Ok(())
    }

    /// Bytes of memory the uncommitted generations' upsert overlays hold, about.
    pub fn overlay_memory(&self) -> usize {
        self.current
            .iter()
            .map(|c| c.overlay.memory())
            .sum::<usize>()
            + self.cut.iter().map(|g| g.overlay.memory()).sum::<usize>()
    }

    /// Ends the generation being written: its open files are closed and it waits for
    /// the next commit. Returns whether there is anything to commit.
    pub async fn cut(&mut self) -> Result<bool, SinkError> {
        if let Some(mut c) = self.current.take() {
            let closed = c.files.close_all().await;
            if let Err(e) = closed {
                self.discard();
                return Err(self.err("write", e));
            }
            let spec_id = c.files.spec_id();
            let mut files: Vec<(i32, DataFile)> =
                c.closed.into_iter().map(|f| (spec_id, f)).collect();
            files.extend(c.files.take_closed().into_iter().map(|f| (spec_id, f)));
            self.cut.push(Generation {
                files,
                overlay: c.overlay,
            });
        }
        Ok(!self.cut.is_empty())
    }

    /// Drops everything not committed: open files, cut generations, the pending schema
    /// (their files are never referenced; orphan cleanup removes them).
    pub fn discard(&mut self) {
        self.current = None;
        self.cut.clear();
        self.pending_schema = None;
        self.written_on = None;
    }

    /// Where a new table goes: `<sink.location>/<table>`, else under the namespace's
    /// `location` property, else `None` (the catalog decides). (`&mut self`: the
    /// sink is `Send` but not `Sync`.)
    async fn location_for_new_table(
        &mut self,
        namespace: &NamespaceIdent,
    ) -> Result<Option<String>, SinkError> {
        let base = match &self.config.location {
            Some(base) => base.clone(),
            None => {
                let found = self
                    .catalog
                    .catalog
                    .get_namespace(namespace)
                    .await
                    .map_err(|e| self.err("read namespace", e))?;
                match found.properties().get("location") {
                    Some(base) => base.clone(),
                    None => return Ok(None),
                }
            }
        };
        Ok(Some(format!(
            "{}/{}",
            base.trim_end_matches('/'),
            self.ident.name()
        )))
    }

    async fn create(&mut self, tracker: &SchemaTracker) -> Result<(), SinkError> {
        let namespace = self.ident.namespace().clone();
        let exists = self
            .catalog
            .catalog
            .namespace_exists(&namespace)
            .await
            .map_err(|e| self.err("check namespace", e))?;
        if !exists {
            match self
                .catalog
                .catalog
                .create_namespace(&namespace, HashMap::new())
                .await
            {
                Ok(_) => {}
                // Another agent created it at the same moment: use it.
                Err(e) if e.kind() == iceberg::ErrorKind::NamespaceAlreadyExists => {
                    tracing::info!(pipeline = %self.pipeline, namespace = %self.config.namespace, "namespace created by another writer meanwhile");
                }
                Err(e) => return Err(self.err("create namespace", e)),
            }
        }
        let mut schema = tracker.new_table_schema()?;
        if let Some(u) = &self.upsert {
            schema = upsert::upsert_schema(&schema, &u.spec)?;
        }
        let (fields, _) = partition::parse_all(&self.config.partition_by);
        let spec = partition::new_table_spec(&fields, &schema)
            .map_err(|m| SinkError::Unwritable(format!("cannot create {}: {m}", self.ident)))?;
        let version = match self.config.format_version {
            3 => FormatVersion::V3,
            _ => FormatVersion::V2,
        };
        let location = self.location_for_new_table(&namespace).await?;
        let creation = TableCreation::builder()
            .name(self.ident.name().to_string())
            .location_opt(location)
            .schema(schema)
            .partition_spec(spec)
            .format_version(version)
            .properties(HashMap::from([
                (
                    "write.parquet.compression-codec".to_string(),
                    "zstd".to_string(),
                ),
                (
                    floe_iceberg::CREATED_BY_PROPERTY.to_string(),
                    self.pipeline.to_string(),
                ),
            ]))
            .build();
        let mut table = match self
            .catalog
            .catalog
            .create_table(&namespace, creation)
            .await
        {
            Ok(table) => table,
            Err(e) if floe_iceberg::is_already_exists(&e) => {
                // Another agent created it at the same moment. Its schema (field ids) may
                // differ from the one our buffered rows were built for: load it and have
                // the pipeline re-read from the offsets it stores.
                self.reload().await?;
                return Err(SinkError::Fenced(format!(
                    "table {} was created by another writer at the same moment; re-reading against its schema",
                    self.ident
                )));
            }
            Err(e) => return Err(self.err("create table", e)),
        };
        if table.metadata().format_version() < version {
            // A catalog that ignored the requested version: upgrade the empty table.
            table = self
                .catalog
                .committer
                .commit(
                    &table,
                    vec![iceberg::TableRequirement::UuidMatch {
                        uuid: table.metadata().uuid(),
                    }],
                    vec![iceberg::TableUpdate::UpgradeFormatVersion {
                        format_version: version,
                    }],
                )
                .await
                .map_err(|e| {
                    SinkError::Unwritable(format!(
                        "cannot set format version {version} on {}: {e}",
                        self.ident
                    ))
                })?;
        }
        tracing::info!(pipeline = %self.pipeline, table = %self.ident, "created table");
        self.table = Some(table);
        if let Some(u) = &mut self.upsert {
            let table = self.table.as_ref().expect("just created");
            u.index = Some(KeyIndex::empty(table, &u.spec, &u.settings)?);
        }
        Ok(())
    }

    /// Commits every cut generation (possibly none) as one snapshot that moves this
    /// pipeline's offsets to `offsets`, if the table still stores `expected` for each
    /// partition the commit covers (the offsets of other partitions are carried forward
    /// as found). `extra` adds summary properties. In upsert mode the position deletes
    /// are computed here, against the exact parent the snapshot commits on. On failure
    /// the generations stay for the next attempt.
    ///
    /// A stale table view (files of it removed by another writer's expiry or compaction)
    /// or, in upsert mode, a parent whose data changed, is reloaded and the commit
    /// prepared again, a bounded number of times.
    ///
    /// The catalog commit is abandoned when `give_up` completes (a time limit, a stop's
    /// grace running out): that attempt fails as [`SinkError::TimedOut`], the
    /// generations stay, and the next attempt's fence finds out whether it landed.
    pub async fn commit(
        &mut self,
        expected: &PartitionMap<Option<i64>>,
        offsets: &OffsetMap,
        extra: HashMap<String, String>,
        give_up: impl std::future::Future<Output = ()>,
    ) -> Result<CommitOutcome, SinkError> {
        let give_up = std::pin::pin!(give_up);
        let mut generations = std::mem::take(&mut self.cut);
        let result = self
            .commit_generations(&mut generations, expected, offsets, extra, give_up)
            .await;
        if result.is_err() {
            // Kept for the next attempt (a rewind discards them).
            generations.append(&mut self.cut);
            self.cut = generations;
        }
        result
    }

    async fn commit_generations<F: std::future::Future<Output = ()>>(
        &mut self,
        generations: &mut Vec<Generation>,
        expected: &PartitionMap<Option<i64>>,
        offsets: &OffsetMap,
        extra: HashMap<String, String>,
        mut give_up: std::pin::Pin<&mut F>,
    ) -> Result<CommitOutcome, SinkError> {
        let mut props = HashMap::from([
            (PIPELINE_KEY.to_string(), self.pipeline.clone()),
            (WRITER_KEY.to_string(), self.writer_id.clone()),
            (COMMIT_KEY.to_string(), Uuid::now_v7().to_string()),
        ]);
        props.extend(extra);
        let fence = Fence {
            pipeline: self.pipeline.clone(),
            expected: expected.clone(),
        };
        let mut rebases = REBASE_RETRY.start();
        loop {
            let table = self
                .table
                .clone()
                .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
            let error = match self
                .commit_on(
                    table,
                    generations,
                    &fence,
                    &props,
                    offsets,
                    give_up.as_mut(),
                )
                .await
            {
                Ok(outcome) => return Ok(outcome),
                Err(e) => e,
            };
            if rebases.retry_after(ErrorClass::Transient).is_none() {
                return Err(error.into_sink_error());
            }
            match error {
                Attempt::Stale(Some(table)) => {
                    // Another writer (another agent on the same table, say) committed.
                    tracing::info!(pipeline = %self.pipeline, table = %self.ident, "another writer changed the table: updating the upsert index and the deletes");
                    self.table = Some(*table);
                }
                Attempt::Stale(None) => {
                    tracing::info!(pipeline = %self.pipeline, table = %self.ident, "the table view is stale (files of it were removed by another writer): reloading");
                    self.reload().await?;
                }
                Attempt::Failed(e) => return Err(e),
            }
        }
    }

    /// One attempt of [`TableSink::commit`] on `table`.
    async fn commit_on<F: std::future::Future<Output = ()>>(
        &mut self,
        table: Table,
        generations: &mut Vec<Generation>,
        fence: &Fence,
        props: &HashMap<String, String>,
        offsets: &OffsetMap,
        give_up: std::pin::Pin<&mut F>,
    ) -> Result<CommitOutcome, Attempt> {
        self.catch_up_index(&table).await.map_err(Attempt::from)?;
        let data: Vec<(i32, DataFile)> = generations
            .iter()
            .flat_map(|g| g.files.iter().cloned())
            .collect();
        let targets = match self.delete_targets(generations, &data) {
            Ok(targets) => targets,
            Err(e) if e.is_index_damage() => {
                // Rebuilt at the next attempt (catch_up_index).
                self.drop_damaged_index(&e);
                return Err(Attempt::Stale(Some(Box::new(table))));
            }
            Err(e) => return Err(Attempt::from(SinkError::from(e))),
        };
        let deletes = upsert::write_deletes(&table, &self.pipeline, targets)
            .await
            .map_err(|e| Attempt::from(SinkError::from(e)))?;
        let delete_files = deletes.files.len();
        let mut snapshot = StagedSnapshot::write(
            &table,
            self.pending_schema.as_ref(),
            data.clone(),
            deletes.files.clone(),
        )
        .await
        .map_err(|e| Attempt::from(self.err("write manifests", e)))?;
        snapshot.remove(deletes.replaced.iter().cloned());
        let options = CommitOptions {
            properties: props,
            offsets,
            new_schema: self.pending_schema.as_ref(),
            written_on: self.written_on,
            fence,
            exact_parent: self.upsert.is_some(),
        };
        // Only the catalog call is abandoned: nothing of the key index is touched before
        // it returns, so the index stays consistent with the snapshot it names.
        let committed = tokio::select! {
            c = commit::commit(
                self.catalog.catalog.as_ref(),
                self.catalog.committer.as_ref(),
                table,
                &mut snapshot,
                options,
            ) => c,
            () = give_up => {
                return Err(Attempt::Failed(SinkError::TimedOut(self.ident.to_string())));
            }
        };
        match committed {
            Ok(Committed { table, snapshot_id }) => {
                self.table = Some(table);
                // The schema is the table's now; files still being written keep its ids.
                self.pending_schema = None;
                self.written_on = None;
                let done = std::mem::take(generations);
                if let Err(e) = self
                    .apply_to_index(&done, &data, &deletes, snapshot_id)
                    .await
                {
                    // The table holds the commit; an index that missed part of it is
                    // rebuilt before its next use.
                    if let Some(u) = &mut self.upsert {
                        u.index = None;
                    }
                    return Err(Attempt::Failed(e));
                }
                Ok(CommitOutcome {
                    snapshot_id,
                    files: data.len(),
                    delete_files,
                    bytes: data.iter().map(|(_, f)| f.file_size_in_bytes()).sum(),
                })
            }
            Err(CommitFailure::Stale(table)) => Err(Attempt::Stale(Some(table))),
            Err(CommitFailure::Iceberg { source, .. })
                if crate::error::is_missing_file(&source) =>
            {
                Err(Attempt::Stale(None))
            }
            Err(e @ (CommitFailure::Fenced { .. } | CommitFailure::SchemaChanged(_))) => {
                Err(Attempt::Failed(SinkError::Fenced(e.to_string())))
            }
            Err(e) => Err(Attempt::Failed(SinkError::Commit(Box::new(e)))),
        }
    }

    /// Drops an upsert index whose files were found damaged: it is rebuilt from the table
    /// before its next use.
    fn drop_damaged_index(&mut self, e: &upsert::UpsertError) {
        tracing::warn!(pipeline = %self.pipeline, table = %self.ident, error = %e, "the upsert index is damaged: rebuilding it from the table");
        if let Some(u) = &mut self.upsert {
            u.index = None;
        }
    }

    /// Upsert: brings the key index to `table`'s current snapshot (the parent the
    /// deletes are computed against): learns other writers' commits since the snapshot
    /// it reflects, or is rebuilt when that cannot be done incrementally.
    async fn catch_up_index(&mut self, table: &Table) -> Result<(), SinkError> {
        let Some(u) = &mut self.upsert else {
            return Ok(());
        };
        let current = table.metadata().current_snapshot_id();
        if let Some(index) = &mut u.index
            && index.snapshot() != current
        {
            let caught_up = match index.catch_up(table, &u.spec).await {
                Err(e) if e.is_index_damage() => {
                    tracing::warn!(pipeline = %self.pipeline, table = %self.ident, error = %e, "the upsert index is damaged: rebuilding it from the table");
                    false
                }
                other => other?,
            };
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, caught_up, "upsert index: learning other writers' commits");
            if !caught_up {
                // Dropped first: its directory is locked while it lives.
                u.index = None;
            }
        }
        if u.index.is_none() {
            let started = std::time::Instant::now();
            let (index, stats) = KeyIndex::rebuild(table, &u.spec, &u.settings).await?;
            log_index(&self.pipeline, &self.ident, &stats, started);
            u.index = Some(index);
        }
        Ok(())
    }

    /// Upsert: the rows a commit of `generations` deletes: the committed rows (in the
    /// key index, caught up to the parent) of every key they wrote, and the rows of their
    /// own files that later writes replaced.
    fn delete_targets(
        &self,
        generations: &[Generation],
        data: &[(i32, DataFile)],
    ) -> Result<Vec<DeleteTarget>, upsert::UpsertError> {
        let Some(index) = self.upsert.as_ref().and_then(|u| u.index.as_ref()) else {
            return Ok(Vec::new());
        };
        let ours: HashMap<&str, (i32, &Struct)> = data
            .iter()
            .map(|(spec, f)| (f.file_path(), (*spec, f.partition())))
            .collect();
        let mut targets: HashMap<Arc<str>, DeleteTarget> = HashMap::new();
        let mut add =
            |path: Arc<str>, spec_id: i32, partition: &Struct, dv: Option<DataFile>, pos: u64| {
                targets
                    .entry(path.clone())
                    .or_insert_with(|| DeleteTarget {
                        path,
                        spec_id,
                        partition: partition.clone(),
                        dv,
                        positions: Vec::new(),
                    })
                    .positions
                    .push(pos);
            };
        for g in generations {
            let written: Vec<KeyHash> = g.overlay.writes().map(|(key, _)| *key).collect();
            for (id, pos) in index.get_many(&written)?.into_iter().flatten() {
                let info = index.file(id)?;
                add(
                    info.path.clone(),
                    info.spec_id,
                    &info.partition,
                    info.dv.clone(),
                    pos,
                );
            }
            for (path, pos) in g.overlay.superseded() {
                match ours.get(path.as_ref()) {
                    Some((spec, partition)) => add(path.clone(), *spec, partition, None, pos),
                    // A file of an earlier generation committed since: in the index.
                    None => {
                        if let Some(id) = index.file_id(&path) {
                            let info = index.file(id)?;
                            add(
                                path.clone(),
                                info.spec_id,
                                &info.partition,
                                info.dv.clone(),
                                pos,
                            );
                        }
                    }
                }
            }
        }
        let mut out: Vec<DeleteTarget> = targets.into_values().collect();
        for t in &mut out {
            t.positions.sort_unstable();
            t.positions.dedup();
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Records a landed commit of `generations` in the upsert index, which then reflects
    /// `snapshot_id` (and spills to disk past its memory budget).
    async fn apply_to_index(
        &mut self,
        generations: &[Generation],
        data: &[(i32, DataFile)],
        deletes: &upsert::CommitDeletes,
        snapshot_id: i64,
    ) -> Result<(), SinkError> {
        let Some(index) = self.upsert.as_mut().and_then(|u| u.index.as_mut()) else {
            return Ok(());
        };
        index.set_snapshot(Some(snapshot_id));
        for (spec, f) in data {
            index.register_file(f.file_path(), *spec, f.partition());
        }
        for (path, dv) in &deletes.vectors {
            if let Some(id) = index.file_id(path) {
                index.set_dv(id, dv.clone());
            }
        }
        for g in generations {
            for (key, row) in g.overlay.writes() {
                match row {
                    Some((path, pos)) => {
                        let id = index.file_id(&path).ok_or_else(|| {
                            SinkError::Internal(format!("row of {path} in no committed file"))
                        })?;
                        index.put(*key, id, pos)?;
                    }
                    None => index.remove(key),
                }
            }
        }
        index.maintain().await?;
        Ok(())
    }

    fn err(&self, operation: &'static str, source: iceberg::Error) -> SinkError {
        SinkError::Iceberg {
            operation,
            table: self.ident.to_string(),
            source: Box::new(source),
        }
    }
}

/// Logs how an upsert index was opened.
fn log_index(
    pipeline: &str,
    table: &iceberg::TableIdent,
    stats: &RebuildStats,
    started: std::time::Instant,
) {
    let ms = started.elapsed().as_millis() as u64;
    if stats.from_disk {
        tracing::info!(pipeline = %pipeline, table = %table, keys = stats.keys, snapshots_caught_up = stats.caught_up, ms, "upsert index opened from disk");
    } else {
        tracing::info!(pipeline = %pipeline, table = %table, keys = stats.keys, data_files = stats.data_files, delete_files = stats.delete_files, duplicates = stats.duplicates, ms, "upsert index rebuilt from the table");
    }
}

/// Why one attempt of a commit did not land.
enum Attempt {
    /// Prepared on a stale view: on this newer table (its data changed under an upsert
    /// commit), or reload (`None`: a file of the view is gone).
    Stale(Option<Box<Table>>),
    /// Give up (the caller's retry policy applies).
    Failed(SinkError),
}

impl Attempt {
    fn into_sink_error(self) -> SinkError {
        match self {
            Attempt::Stale(_) => SinkError::Contended(format!(
                "the table kept changing under the commit ({MAX_REBASES} times in a row)"
            )),
            Attempt::Failed(e) => e,
        }
    }
}

impl From<SinkError> for Attempt {
    /// A missing file while preparing is a stale view; anything else fails the attempt.
    fn from(e: SinkError) -> Attempt {
        if e.is_missing_file() {
            Attempt::Stale(None)
        } else {
            Attempt::Failed(e)
        }
    }
}

/// Keeps the rows the upsert plan writes and fills their `_op` column.
fn apply_plan(batches: Vec<RecordBatch>, plan: &Plan) -> Result<Vec<RecordBatch>, SinkError> {
    let arrow_err = |e: arrow_schema::ArrowError| SinkError::Batch(batch::BatchError::from(e));
    let mut out = Vec::with_capacity(batches.len());
    let mut at = 0;
    let mut ops = plan.ops.iter();
    for b in batches {
        let n = b.num_rows();
        let keep = BooleanArray::from(plan.keep[at..at + n].to_vec());
        at += n;
        let kept = arrow_select::filter::filter_record_batch(&b, &keep).map_err(arrow_err)?;
        let schema = kept.schema();
        let Ok(op_index) = schema.index_of(OP_COLUMN) else {
            out.push(kept);
            continue;
        };
        let op: ArrayRef = Arc::new(StringArray::from_iter_values(
            ops.by_ref().take(kept.num_rows()).copied(),
        ));
        let mut columns = kept.columns().to_vec();
        columns[op_index] = op;
        out.push(RecordBatch::try_new(schema, columns).map_err(arrow_err)?);
    }
    Ok(out)
}
