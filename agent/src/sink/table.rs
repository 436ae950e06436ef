//! The target table: load or create, evolve the schema, write Parquet, commit.

use std::collections::HashMap;

use iceberg::spec::{DataFile, DataFileFormat, FormatVersion};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{ErrorKind, NamespaceIdent, TableCreation, TableIdent};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use uuid::Uuid;

use super::commit::{self, CommitFailure, CommitOptions, Fence, StagedSnapshot};
use super::upsert::{self, KeyHash, KeyIndex, KeySpec, Plan};
use super::{CatalogHandle, Mode, SinkConfig, SinkError};
use crate::batch::{BATCH_ROWS, BatchEncoder};
use crate::offsets::{COMMIT_KEY, OFFSETS_KEY, OffsetMap, PIPELINE_KEY, WRITER_KEY};
use crate::schema::SchemaTracker;
use crate::source::KafkaRecord;

/// One pipeline's view of its target table.
pub struct TableSink {
    catalog: CatalogHandle,
    ident: TableIdent,
    table: Option<Table>,
    config: SinkConfig,
    pipeline: String,
    writer_id: String,
    upsert: Option<UpsertState>,
    /// The schema the next commit sets (new columns, widened types), if any.
    pending_schema: Option<iceberg::spec::Schema>,
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
    /// Upsert mode: keys touched and where the new rows are.
    touched: Vec<KeyHash>,
    placed: Vec<(KeyHash, String, u64)>,
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
            pending_schema: None,
        };
        sink.reload().await?;
        if sink.table.is_none() && !config.create_table {
            return Err(SinkError::MissingTable(sink.ident.to_string()));
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

    /// Rebuilds the upsert index from the table if it is not there.
    async fn ensure_index(&mut self) -> Result<(), SinkError> {
        let (Some(table), Some(u)) = (&self.table, &mut self.upsert) else {
            return Ok(());
        };
        if u.index.is_some() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (index, stats) = KeyIndex::rebuild(table, &u.spec, self.config.max_keys).await?;
        tracing::info!(pipeline = %self.pipeline, table = %self.ident, keys = stats.keys, data_files = stats.data_files, delete_files = stats.delete_files, duplicates = stats.duplicates, ms = started.elapsed().as_millis() as u64, "upsert index rebuilt from the table");
        u.index = Some(index);
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

    /// Reads the table again from the catalog.
    pub async fn reload(&mut self) -> Result<(), SinkError> {
        self.table = match self.catalog.catalog.load_table(&self.ident).await {
            Ok(t) => Some(t),
            Err(e)
                if e.kind() == ErrorKind::TableNotFound
                    || e.message().contains("No such table") =>
            {
                None
            }
            Err(e) => return Err(self.err("load table", e)),
        };
        // The table may have changed under us: the upsert index is rebuilt when next needed.
        if let Some(u) = &mut self.upsert {
            u.index = None;
        }
        self.pending_schema = None;
        Ok(())
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

    /// Creates the table, or adds the columns the tracker learned.
    /// A new table starts with a snapshot carrying `initial` offsets (the pipeline's
    /// position before this commit), so that a crash before its first data commit makes
    /// the pipeline read that data again.
    pub async fn apply_schema(
        &mut self,
        tracker: &SchemaTracker,
        initial: &OffsetMap,
    ) -> Result<(), SinkError> {
        let Some(table) = &self.table else {
            self.create(tracker).await?;
            self.commit(Staged::empty(), &OffsetMap::default(), initial)
                .await?;
            return Ok(());
        };
        // The new schema is committed with the data that needs it, in one snapshot.
        let metadata = table.metadata();
        self.pending_schema =
            tracker.evolved_schema(metadata.current_schema(), metadata.last_column_id())?;
        if let Some(next) = &self.pending_schema {
            let before = metadata.current_schema();
            let changed: Vec<String> = next
                .field_id_to_name_map()
                .iter()
                .filter(|(id, _)| {
                    before.field_by_id(**id).map(|f| &f.field_type)
                        != next.field_by_id(**id).map(|f| &f.field_type)
                })
                .map(|(_, name)| name.clone())
                .collect();
            tracing::info!(pipeline = %self.pipeline, table = %self.ident, columns = ?changed, "schema changes with the next commit");
        }
        Ok(())
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
            self.catalog
                .catalog
                .create_namespace(&namespace, HashMap::new())
                .await
                .map_err(|e| self.err("create namespace", e))?;
        }
        let mut schema = tracker.new_table_schema()?;
        if let Some(u) = &self.upsert {
            schema = upsert::upsert_schema(&schema, &u.spec)?;
        }
        let creation = TableCreation::builder()
            .name(self.ident.name().to_string())
            .schema(schema)
            .format_version(FormatVersion::V2)
            .properties(HashMap::from([(
                "write.parquet.compression-codec".to_string(),
                "zstd".to_string(),
            )]))
            .build();
        let table = self
            .catalog
            .catalog
            .create_table(&namespace, creation)
            .await
            .map_err(|e| self.err("create table", e))?;
        tracing::info!(pipeline = %self.pipeline, table = %self.ident, "created table");
        self.table = Some(table);
        if let Some(u) = &mut self.upsert {
            u.index = Some(KeyIndex::new(self.config.max_keys));
        }
        Ok(())
    }

    /// Writes records as Parquet data files in the table's current schema. In upsert mode
    /// `keys` holds each record's key: only the last record per key is written (none for
    /// a tombstone), and the rows they replace are deleted at commit.
    pub async fn write(
        &mut self,
        records: &[KafkaRecord],
        keys: Option<&[KeyHash]>,
    ) -> Result<Staged, SinkError> {
        if self.upsert.is_none() {
            let rows: Vec<&KafkaRecord> = records.iter().collect();
            let data = self.write_rows(&rows, None).await?;
            return Ok(Staged {
                data,
                ..Staged::default()
            });
        }
        let keys = keys.ok_or_else(|| {
            SinkError::Io("upsert write without keys (a bug: please report)".into())
        })?;
        self.ensure_index().await?;
        let index = self
            .upsert
            .as_ref()
            .and_then(|u| u.index.as_ref())
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        let plan = Plan::new(records, keys, index);
        let data = self.write_rows(&plan.rows, Some(&plan.ops)).await?;
        // Row positions of the new rows: files hold the rows in order.
        let mut placed = Vec::with_capacity(plan.rows.len());
        let mut row_keys = plan.row_keys.iter();
        for file in &data {
            for pos in 0..file.record_count() {
                let key = row_keys.next().ok_or_else(|| {
                    SinkError::Io("data files hold more rows than written".into())
                })?;
                placed.push((*key, file.file_path().to_string(), pos));
            }
        }
        if row_keys.next().is_some() {
            return Err(SinkError::Io(
                "data files hold fewer rows than written".into(),
            ));
        }
        Ok(Staged {
            data,
            touched: plan.touched,
            placed,
        })
    }

    async fn write_rows(
        &self,
        rows: &[&KafkaRecord],
        ops: Option<&[&str]>,
    ) -> Result<Vec<DataFile>, SinkError> {
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let schema = match &self.pending_schema {
            Some(s) => std::sync::Arc::new(s.clone()),
            None => table.metadata().current_schema().clone(),
        };
        let encoder = BatchEncoder::new(&schema)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid zstd level"),
            ))
            .build();
        let location =
            DefaultLocationGenerator::new(table.metadata()).map_err(|e| self.err("write", e))?;
        let names = DefaultFileNameGenerator::new(
            format!("{}-{}", self.pipeline, Uuid::now_v7()),
            None,
            DataFileFormat::Parquet,
        );
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, schema),
            self.config.target_file_size as usize,
            table.file_io().clone(),
            location,
            names,
        );
        let mut writer = DataFileWriterBuilder::new(rolling)
            .build(None)
            .await
            .map_err(|e| self.err("write", e))?;
        for (i, chunk) in rows.chunks(BATCH_ROWS).enumerate() {
            let ops = ops.map(|o| &o[i * BATCH_ROWS..i * BATCH_ROWS + chunk.len()]);
            writer
                .write(encoder.encode_rows(chunk, ops)?)
                .await
                .map_err(|e| self.err("write", e))?;
        }
        writer.close().await.map_err(|e| self.err("write", e))
    }

    /// Commits staged files (possibly none) as one snapshot carrying `offsets`, if the
    /// table still stores `expected` for this pipeline. In upsert mode the position
    /// deletes are computed here, against the exact parent the snapshot commits on.
    pub async fn commit(
        &mut self,
        staged: Staged,
        expected: &OffsetMap,
        offsets: &OffsetMap,
    ) -> Result<CommitOutcome, SinkError> {
        let props = HashMap::from([
            (OFFSETS_KEY.to_string(), offsets.to_summary_value()),
            (PIPELINE_KEY.to_string(), self.pipeline.clone()),
            (WRITER_KEY.to_string(), self.writer_id.clone()),
            (COMMIT_KEY.to_string(), Uuid::now_v7().to_string()),
        ]);
        let fence = Fence {
            pipeline: self.pipeline.clone(),
            expected: expected.clone(),
        };
        // Upsert: a commit whose deletes went stale is redone a few times, then given up.
        let mut rebases = 0;
        loop {
            let table = self
                .table
                .clone()
                .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
            let deletes = self.position_deletes(&table, &staged).await?;
            let delete_files = deletes.len();
            let mut snapshot = StagedSnapshot::write(
                &table,
                self.pending_schema.as_ref(),
                staged.data.clone(),
                deletes,
            )
            .await
            .map_err(|e| self.err("write manifests", e))?;
            let options = CommitOptions {
                properties: &props,
                new_schema: self.pending_schema.as_ref(),
                fence: &fence,
                exact_parent: self.upsert.is_some(),
            };
            let result = commit::commit(
                self.catalog.catalog.as_ref(),
                self.catalog.committer.as_ref(),
                table,
                &mut snapshot,
                options,
            )
            .await;
            match result {
                Ok(table) => {
                    let snapshot_id = table.metadata().current_snapshot_id().unwrap_or_default();
                    self.table = Some(table);
                    self.pending_schema = None;
                    self.apply_to_index(&staged)?;
                    return Ok(CommitOutcome {
                        snapshot_id,
                        files: staged.data.len(),
                        delete_files,
                    });
                }
                Err(CommitFailure::Stale(table)) if rebases < 5 => {
                    rebases += 1;
                    tracing::warn!(pipeline = %self.pipeline, table = %self.ident, "another writer changed the table: rebuilding the upsert index and the deletes");
                    self.table = Some(*table);
                    if let Some(u) = &mut self.upsert {
                        u.index = None;
                    }
                    self.ensure_index().await?;
                }
                Err(e @ (CommitFailure::Fenced { .. } | CommitFailure::SchemaChanged(_))) => {
                    return Err(SinkError::Fenced(e.to_string()));
                }
                Err(e) => return Err(SinkError::Commit(Box::new(e))),
            }
        }
    }

    /// Upsert: one position-delete file for the older rows of every key the commit touches.
    async fn position_deletes(
        &self,
        table: &Table,
        staged: &Staged,
    ) -> Result<Vec<DataFile>, SinkError> {
        let Some(index) = self.upsert.as_ref().and_then(|u| u.index.as_ref()) else {
            return Ok(Vec::new());
        };
        let rows = upsert::rows_to_delete(&staged.touched, index);
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            upsert::write_position_deletes(table, &self.pipeline, rows).await?,
        ])
    }

    fn apply_to_index(&mut self, staged: &Staged) -> Result<(), SinkError> {
        let Some(index) = self.upsert.as_mut().and_then(|u| u.index.as_mut()) else {
            return Ok(());
        };
        for k in &staged.touched {
            index.remove(k);
        }
        for (k, file, pos) in &staged.placed {
            index.put(*k, file, *pos)?;
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
