//! The target table: load or create, evolve the schema, write Parquet, commit.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use iceberg::spec::{DataFile, FormatVersion, Schema};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};
use uuid::Uuid;

use super::upsert::{self, KeyHash, KeyIndex, KeySpec, OP_COLUMN, Plan};
use super::{Mode, SinkConfig, SinkError, partition, writer};
use crate::batch::{self, Buffered};
use crate::catalog::CatalogHandle;
use crate::commit::{self, CommitFailure, CommitOptions, Committed, Fence, StagedSnapshot};
use crate::commit::{COMMIT_KEY, OffsetMap, PIPELINE_KEY, WRITER_KEY};
use crate::record::PartitionMap;
use crate::schema::SchemaTracker;

/// Times a commit whose deletes went stale (other writers keep committing) is redone
/// before it is given up on (a transient failure: the committer retries the seal).
const MAX_REBASES: u32 = 20;

/// One pipeline's view of its target table.
pub struct TableSink {
    catalog: CatalogHandle,
    ident: TableIdent,
    table: Option<Table>,
    config: SinkConfig,
    pipeline: String,
    writer_id: String,
    upsert: Option<UpsertState>,
}

/// Upsert mode's key and index (rebuilt from the table when missing).
struct UpsertState {
    spec: KeySpec,
    index: Option<KeyIndex>,
}

/// Files written for one commit, not yet committed.
#[derive(Default)]
pub struct Staged {
    data: Vec<DataFile>,
    /// The partition spec the data files were written in.
    spec_id: i32,
    /// The schema the files were written with when it is not the table's current one:
    /// the commit sets it (new columns, widened types) in the same snapshot.
    new_schema: Option<Schema>,
    /// The table schema (id, last column id) the files' schema was derived from.
    written_on: Option<(i32, i32)>,
    /// Upsert mode: keys touched and where the new rows are (index into `data`, position).
    touched: Vec<KeyHash>,
    placed: Vec<(KeyHash, usize, u64)>,
}

impl Staged {
    /// Nothing to add: a commit that only moves offsets.
    pub fn empty() -> Self {
        Staged::default()
    }

    /// Bytes of the data files written (for `floe_bytes_committed_total`).
    pub fn data_bytes(&self) -> u64 {
        self.data.iter().map(DataFile::file_size_in_bytes).sum()
    }
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
            }),
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

    /// Rebuilds the upsert index from the table if it is not there. A file of the table
    /// view that is gone (another writer's expiry) means the view is stale: reload and
    /// read again.
    async fn ensure_index(&mut self) -> Result<(), SinkError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (Some(table), Some(u)) = (&self.table, &mut self.upsert) else {
                return Ok(());
            };
            if u.index.is_some() {
                return Ok(());
            }
            let started = std::time::Instant::now();
            match KeyIndex::rebuild(table, &u.spec, self.config.max_keys).await {
                Ok((index, stats)) => {
                    tracing::info!(pipeline = %self.pipeline, table = %self.ident, keys = stats.keys, data_files = stats.data_files, delete_files = stats.delete_files, duplicates = stats.duplicates, ms = started.elapsed().as_millis() as u64, "upsert index rebuilt from the table");
                    u.index = Some(index);
                    return Ok(());
                }
                Err(e) => {
                    let e = SinkError::from(e);
                    if !e.is_missing_file() || attempt >= MAX_REBASES {
                        return Err(e);
                    }
                    tracing::info!(pipeline = %self.pipeline, table = %self.ident, error = %e, "the table view is stale (a file of it is gone): reloading");
                    self.reload().await?;
                }
            }
        }
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
            Err(e) if crate::catalog::is_not_found(&e) => None,
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
    /// this commit), so that a crash before its first data commit makes the pipeline
    /// read that data again.
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
        self.commit(Staged::empty(), &expected, initial, HashMap::new())
            .await?;
        Ok(true)
    }

    /// The schema rows admitted by `tracker` are written with: the table's current one,
    /// or the one a commit evolves it to. Rows admitted against columns another writer
    /// has since given an incompatible type cannot be written without loss: that is
    /// [`SinkError::Fenced`], and the pipeline reads them again against the table.
    fn write_schema(
        &self,
        table: &Table,
        tracker: &SchemaTracker,
    ) -> Result<(Arc<Schema>, Option<Schema>), SinkError> {
        let metadata = table.metadata();
        let current = metadata.current_schema();
        if let Some(conflict) = tracker.conflict_with(current) {
            return Err(SinkError::Fenced(format!(
                "the schema of {} changed under buffered rows ({conflict}); re-reading them against the table's schema",
                self.ident
            )));
        }
        let evolved = tracker.evolved_schema(current, metadata.last_column_id())?;
        if let Some(next) = &evolved {
            let changed: Vec<String> = next
                .field_id_to_name_map()
                .iter()
                .filter(|(id, _)| {
                    current.field_by_id(**id).map(|f| &f.field_type)
                        != next.field_by_id(**id).map(|f| &f.field_type)
                })
                .map(|(_, name)| name.clone())
                .collect();
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, columns = ?changed, "schema changes with this commit");
        }
        let schema = match &evolved {
            Some(s) => Arc::new(s.clone()),
            None => current.clone(),
        };
        Ok((schema, evolved))
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
                    tracing::info!(pipeline = %self.pipeline, namespace = ?namespace, "namespace created by another writer meanwhile");
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
        let creation = TableCreation::builder()
            .name(self.ident.name().to_string())
            .schema(schema)
            .partition_spec(spec)
            .format_version(version)
            .properties(HashMap::from([(
                "write.parquet.compression-codec".to_string(),
                "zstd".to_string(),
            )]))
            .build();
        let mut table = match self
            .catalog
            .catalog
            .create_table(&namespace, creation)
            .await
        {
            Ok(table) => table,
            Err(e) if crate::catalog::is_already_exists(&e) => {
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
            u.index = Some(KeyIndex::new(self.config.max_keys));
        }
        Ok(())
    }

    /// Writes buffered rows as Parquet data files in the schema the commit sets: the
    /// table's current one plus what `tracker` learned (derived from the table as it is
    /// now, so a retry after a reload never loses a column). In upsert mode only the last
    /// row per key is written (none for a tombstone), and the rows they replace are
    /// deleted at commit. Encoding runs on a blocking thread, off the async workers.
    pub async fn write(
        &mut self,
        buffered: &Buffered,
        tracker: &SchemaTracker,
    ) -> Result<Staged, SinkError> {
        let table = self
            .table
            .clone()
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        if buffered.rows == 0 {
            return Ok(Staged::default());
        }
        let (schema, new_schema) = self.write_schema(&table, tracker)?;
        let written_on = Some((
            table.metadata().current_schema_id(),
            table.metadata().last_column_id(),
        ));
        let plan = match &self.upsert {
            None => None,
            Some(_) => {
                self.ensure_index().await?;
                let index = self
                    .upsert
                    .as_ref()
                    .and_then(|u| u.index.as_ref())
                    .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
                Some(Plan::new(&buffered.keys, index))
            }
        };
        let prefix = self.pipeline.clone();
        let target = self.config.target_file_size;
        let ident = self.ident.to_string();
        let handle = tokio::runtime::Handle::current();
        let sealed = buffered.batches.clone();
        let (written, plan) = tokio::task::spawn_blocking(move || {
            let arrow = batch::table_arrow_schema(&schema)?;
            let mut batches = Vec::with_capacity(sealed.len());
            for b in &sealed {
                batches.push(batch::conform(b, &arrow).map_err(batch::BatchError::from)?);
            }
            if let Some(plan) = &plan {
                batches = apply_plan(batches, plan)?;
            }
            let written = handle
                .block_on(writer::write_data_files(
                    &table, schema, batches, &prefix, target,
                ))
                .map_err(|e| SinkError::Iceberg {
                    operation: "write",
                    table: ident,
                    source: Box::new(e),
                })?;
            Ok::<_, SinkError>((written, plan))
        })
        .await
        .map_err(|e| SinkError::Internal(format!("writer thread: {e}")))??;
        let writer::Written {
            files: data,
            spec_id,
            order,
        } = written;
        let Some(plan) = plan else {
            return Ok(Staged {
                data,
                spec_id,
                new_schema,
                written_on,
                ..Staged::default()
            });
        };
        // Row positions of the new rows: files hold the rows in the writer's order.
        let total: u64 = data.iter().map(|f| f.record_count()).sum();
        if total != plan.row_keys.len() as u64 {
            return Err(SinkError::Internal(format!(
                "data files hold {total} rows, {} were written",
                plan.row_keys.len()
            )));
        }
        let mut placed = Vec::with_capacity(plan.row_keys.len());
        let mut at = 0usize;
        for (i, file) in data.iter().enumerate() {
            for pos in 0..file.record_count() {
                let row = order.as_ref().map_or(at, |o| o[at] as usize);
                placed.push((plan.row_keys[row], i, pos));
                at += 1;
            }
        }
        Ok(Staged {
            data,
            spec_id,
            new_schema,
            written_on,
            touched: plan.touched,
            placed,
        })
    }

    /// Commits staged files (possibly none) as one snapshot that moves this pipeline's
    /// offsets to `offsets`, if the table still stores `expected` for each partition the
    /// commit covers (the offsets of other partitions are carried forward as found).
    /// `extra` adds summary properties. In upsert mode the position deletes are computed
    /// here, against the exact parent the snapshot commits on, with the key index caught
    /// up to that parent first.
    ///
    /// A stale table view (files of it removed by another writer's expiry or compaction)
    /// or, in upsert mode, a parent whose data changed, is reloaded and the commit
    /// prepared again, a bounded number of times.
    pub async fn commit(
        &mut self,
        staged: Staged,
        expected: &PartitionMap<Option<i64>>,
        offsets: &OffsetMap,
        extra: HashMap<String, String>,
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
        let mut rebases = 0;
        loop {
            let table = self
                .table
                .clone()
                .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
            let error = match self
                .commit_on(table, &staged, &fence, &props, offsets)
                .await
            {
                Ok(outcome) => return Ok(outcome),
                Err(e) => e,
            };
            if rebases >= MAX_REBASES {
                return Err(error.into_sink_error());
            }
            rebases += 1;
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
    async fn commit_on(
        &mut self,
        table: Table,
        staged: &Staged,
        fence: &Fence,
        props: &HashMap<String, String>,
        offsets: &OffsetMap,
    ) -> Result<CommitOutcome, Attempt> {
        self.catch_up_index(&table).await.map_err(Attempt::from)?;
        let deletes = self.deletes(&table, staged).await.map_err(Attempt::from)?;
        let delete_files = deletes.files.len();
        let data = staged
            .data
            .iter()
            .map(|f| (staged.spec_id, f.clone()))
            .collect();
        let mut snapshot = StagedSnapshot::write(
            &table,
            staged.new_schema.as_ref(),
            data,
            deletes.files.clone(),
        )
        .await
        .map_err(|e| Attempt::from(self.err("write manifests", e)))?;
        snapshot.remove(deletes.replaced.iter().cloned());
        let options = CommitOptions {
            properties: props,
            offsets,
            new_schema: staged.new_schema.as_ref(),
            written_on: staged.written_on,
            fence,
            exact_parent: self.upsert.is_some(),
        };
        let committed = commit::commit(
            self.catalog.catalog.as_ref(),
            self.catalog.committer.as_ref(),
            table,
            &mut snapshot,
            options,
        )
        .await;
        match committed {
            Ok(Committed { table, snapshot_id }) => {
                self.table = Some(table);
                if let Err(e) = self.apply_to_index(staged, &deletes, snapshot_id) {
                    // The table holds the commit; an index that missed part of it is
                    // rebuilt before its next use.
                    if let Some(u) = &mut self.upsert {
                        u.index = None;
                    }
                    return Err(Attempt::Failed(e));
                }
                Ok(CommitOutcome {
                    snapshot_id,
                    files: staged.data.len(),
                    delete_files,
                    bytes: staged.data_bytes(),
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
            let caught_up = index.catch_up(table, &u.spec).await?;
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, caught_up, "upsert index: learning other writers' commits");
            if !caught_up {
                u.index = None;
            }
        }
        if u.index.is_none() {
            let started = std::time::Instant::now();
            let (index, stats) = KeyIndex::rebuild(table, &u.spec, self.config.max_keys).await?;
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, keys = stats.keys, data_files = stats.data_files, delete_files = stats.delete_files, duplicates = stats.duplicates, ms = started.elapsed().as_millis() as u64, "upsert index rebuilt from the table");
            u.index = Some(index);
        }
        Ok(())
    }

    /// Upsert: the delete files removing the older rows of every key the commit touches
    /// (position deletes per partition, or deletion vectors on a v3 table).
    async fn deletes(
        &self,
        table: &Table,
        staged: &Staged,
    ) -> Result<upsert::CommitDeletes, SinkError> {
        let Some(index) = self.upsert.as_ref().and_then(|u| u.index.as_ref()) else {
            return Ok(upsert::CommitDeletes::default());
        };
        let rows = upsert::rows_to_delete(&staged.touched, index);
        Ok(upsert::write_deletes(table, &self.pipeline, index, rows).await?)
    }

    /// Records a landed commit in the upsert index, which then reflects `snapshot_id`.
    fn apply_to_index(
        &mut self,
        staged: &Staged,
        deletes: &upsert::CommitDeletes,
        snapshot_id: i64,
    ) -> Result<(), SinkError> {
        let Some(index) = self.upsert.as_mut().and_then(|u| u.index.as_mut()) else {
            return Ok(());
        };
        index.set_snapshot(Some(snapshot_id));
        for (id, dv) in &deletes.vectors {
            index.set_dv(*id, dv.clone());
        }
        for k in &staged.touched {
            index.remove(k);
        }
        let ids: Vec<u32> = staged
            .data
            .iter()
            .map(|f| index.register_file(f.file_path(), staged.spec_id, f.partition()))
            .collect();
        for (k, file, pos) in &staged.placed {
            index.put(*k, ids[*file], *pos)?;
        }
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
