//! The target table: load or create, evolve the schema, write Parquet, commit.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use uuid::Uuid;

use super::fence::{Expectation, FencedCatalog, is_fenced};
use super::{SinkConfig, SinkError};
use crate::batch::{BATCH_ROWS, BatchEncoder};
use crate::offsets::{COMMIT_KEY, OFFSETS_KEY, OffsetMap, PIPELINE_KEY, WRITER_KEY};
use crate::schema::SchemaTracker;
use crate::source::KafkaRecord;

/// One pipeline's view of its target table.
pub struct TableSink {
    catalog: FencedCatalog,
    ident: TableIdent,
    table: Option<Table>,
    config: SinkConfig,
    pipeline: String,
    writer_id: String,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The new snapshot.
    pub snapshot_id: i64,
    /// Data files it added (0 for a snapshot that only moves offsets).
    pub files: usize,
}

impl TableSink {
    /// Loads the table `table` of the sink's namespace (or remembers to create it on the
    /// first commit, if allowed).
    pub async fn open(
        catalog: Arc<dyn Catalog>,
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
            catalog: FencedCatalog::new(catalog),
            ident,
            table: None,
            config: config.clone(),
            pipeline: pipeline.to_string(),
            writer_id: writer_id.to_string(),
        };
        sink.reload().await?;
        if sink.table.is_none() && !config.create_table {
            return Err(SinkError::MissingTable(sink.ident.to_string()));
        }
        Ok(sink)
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
        self.table = match self.catalog.load_table(&self.ident).await {
            Ok(t) => Some(t),
            Err(e)
                if e.kind() == ErrorKind::TableNotFound
                    || e.message().contains("No such table") =>
            {
                None
            }
            Err(e) => return Err(self.err("load table", e)),
        };
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
            self.commit(Vec::new(), &OffsetMap::default(), initial)
                .await?;
            return Ok(());
        };
        let additions = tracker.additions();
        if additions.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = additions
            .iter()
            .map(|a| {
                a.parent
                    .as_ref()
                    .map_or(a.name.clone(), |p| format!("{p}.{}", a.name))
            })
            .collect();
        let tx = Transaction::new(table);
        let mut action = tx.update_schema();
        for a in additions {
            action = action.add_column(match a.parent {
                Some(parent) => AddColumn::builder()
                    .parent(parent)
                    .name(a.name)
                    .field_type(a.field_type)
                    .build(),
                None => AddColumn::optional(a.name, a.field_type),
            });
        }
        let tx = action.apply(tx).map_err(|e| self.err("add columns", e))?;
        let table = tx
            .commit(&self.catalog)
            .await
            .map_err(|e| self.err("add columns", e))?;
        tracing::info!(pipeline = %self.pipeline, table = %self.ident, columns = ?names, "added columns");
        self.table = Some(table);
        Ok(())
    }

    async fn create(&mut self, tracker: &SchemaTracker) -> Result<(), SinkError> {
        let namespace = self.ident.namespace().clone();
        let exists = self
            .catalog
            .namespace_exists(&namespace)
            .await
            .map_err(|e| self.err("check namespace", e))?;
        if !exists {
            self.catalog
                .create_namespace(&namespace, HashMap::new())
                .await
                .map_err(|e| self.err("create namespace", e))?;
        }
        let creation = TableCreation::builder()
            .name(self.ident.name().to_string())
            .schema(tracker.new_table_schema()?)
            .properties(HashMap::from([(
                "write.parquet.compression-codec".to_string(),
                "zstd".to_string(),
            )]))
            .build();
        let table = self
            .catalog
            .create_table(&namespace, creation)
            .await
            .map_err(|e| self.err("create table", e))?;
        tracing::info!(pipeline = %self.pipeline, table = %self.ident, "created table");
        self.table = Some(table);
        Ok(())
    }

    /// Writes records as Parquet data files in the table's current schema.
    pub async fn write(&self, records: &[KafkaRecord]) -> Result<Vec<DataFile>, SinkError> {
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let schema = table.metadata().current_schema().clone();
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
        for chunk in records.chunks(BATCH_ROWS) {
            writer
                .write(encoder.encode(chunk)?)
                .await
                .map_err(|e| self.err("write", e))?;
        }
        writer.close().await.map_err(|e| self.err("write", e))
    }

    /// Commits data files (possibly none) as one snapshot carrying `offsets`, if the table
    /// still stores `expected` for this pipeline.
    pub async fn commit(
        &mut self,
        files: Vec<DataFile>,
        expected: &OffsetMap,
        offsets: &OffsetMap,
    ) -> Result<CommitOutcome, SinkError> {
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| SinkError::MissingTable(self.ident.to_string()))?;
        let count = files.len();
        let props = HashMap::from([
            (OFFSETS_KEY.to_string(), offsets.to_summary_value()),
            (PIPELINE_KEY.to_string(), self.pipeline.clone()),
            (WRITER_KEY.to_string(), self.writer_id.clone()),
            (COMMIT_KEY.to_string(), Uuid::now_v7().to_string()),
        ]);
        let tx = Transaction::new(table);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(props)
            .apply(tx)
            .map_err(|e| self.err("commit", e))?;
        self.catalog.expect(Some(Expectation {
            pipeline: self.pipeline.clone(),
            table: self.ident.clone(),
            stored: expected.clone(),
        }));
        let result = tx.commit(&self.catalog).await;
        self.catalog.expect(None);
        match result {
            Ok(table) => {
                let snapshot_id = table.metadata().current_snapshot_id().unwrap_or_default();
                self.table = Some(table);
                Ok(CommitOutcome {
                    snapshot_id,
                    files: count,
                })
            }
            Err(e) if is_fenced(&e) => Err(SinkError::Fenced(e.message().to_string())),
            Err(e) => Err(self.err("commit", e)),
        }
    }

    fn err(&self, operation: &'static str, source: iceberg::Error) -> SinkError {
        SinkError::Iceberg {
            operation,
            table: self.ident.to_string(),
            source: Box::new(source),
        }
    }
}
