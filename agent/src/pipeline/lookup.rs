//! Where newly assigned partitions start: the offsets the tables store, read fresh from
//! the catalog when the partitions are assigned.

use std::sync::Arc;
use std::time::Duration;

use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::CatalogHandle;
use crate::commit::OffsetMap;
use crate::config::PipelineConfig;
use crate::record::TopicPartition;
use crate::sink::TableSink;
use crate::source::{Assignment, KnownOffsets, PositionLookup, resume_position};

/// How long an assignment may wait for the catalog before using the last known offsets
/// (a stale position is safe: the commit fence refuses what another writer holds).
const FRESH_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Stores what the tables hold now, for the lookup to fall back on.
pub(super) fn remember(known: &KnownOffsets, tables: &[TableSink]) {
    let mut map = known.lock().expect("known offsets");
    for (i, t) in tables.iter().enumerate() {
        let Ok(offsets) = t.stored_offsets() else {
            continue;
        };
        for (tp, o) in offsets.0 {
            map.entry(tp).or_insert_with(|| vec![None; tables.len()])[i] = Some(o);
        }
    }
}

/// The pipeline's tables, read through the catalog.
pub(super) struct TablePositions {
    catalog: CatalogHandle,
    tables: Vec<TableIdent>,
    pipeline: String,
    known: Arc<KnownOffsets>,
    runtime: tokio::runtime::Handle,
}

impl TablePositions {
    pub(super) fn new(
        config: &PipelineConfig,
        catalog: CatalogHandle,
        known: Arc<KnownOffsets>,
    ) -> TablePositions {
        let namespace = NamespaceIdent::from_vec(
            config
                .sink
                .namespace
                .split('.')
                .map(str::to_string)
                .collect(),
        )
        .unwrap_or_else(|_| NamespaceIdent::new(config.sink.namespace.clone()));
        let tables = super::table_names(config)
            .into_iter()
            .map(|t| TableIdent::new(namespace.clone(), t))
            .collect();
        TablePositions {
            catalog,
            tables,
            pipeline: config.name.clone(),
            known,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Per table: its stored offsets, `None` when it does not exist yet.
    async fn read(&self) -> Result<Vec<Option<OffsetMap>>, String> {
        let mut out = Vec::with_capacity(self.tables.len());
        for ident in &self.tables {
            match self.catalog.catalog.load_table(ident).await {
                Ok(t) => out.push(Some(
                    OffsetMap::from_table(t.metadata(), &self.pipeline)
                        .map_err(|e| e.to_string())?,
                )),
                Err(e) if crate::catalog::is_not_found(&e) => out.push(None),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(out)
    }
}

impl PositionLookup for TablePositions {
    fn lookup(&self, tps: &[TopicPartition]) -> Vec<Assignment> {
        let fresh = self
            .runtime
            .block_on(async { tokio::time::timeout(FRESH_READ_TIMEOUT, self.read()).await });
        let fresh = match fresh {
            Ok(Ok(tables)) => Some(tables),
            Ok(Err(e)) => {
                tracing::warn!(pipeline = %self.pipeline, error = %e, "cannot read the tables' offsets for the assignment: using the last known ones");
                None
            }
            Err(_) => {
                tracing::warn!(pipeline = %self.pipeline, "the catalog did not answer in time for the assignment: using the last known offsets");
                None
            }
        };
        let known = self.known.lock().expect("known offsets");
        tps.iter()
            .map(|tp| {
                let (stored, exists): (Vec<Option<i64>>, Vec<bool>) = match &fresh {
                    Some(tables) => tables
                        .iter()
                        .map(|t| match t {
                            Some(offsets) => (offsets.0.get(tp).copied(), true),
                            None => (None, false),
                        })
                        .unzip(),
                    None => {
                        let stored = known
                            .get(tp)
                            .cloned()
                            .unwrap_or_else(|| vec![None; self.tables.len()]);
                        let exists = vec![false; self.tables.len()];
                        (stored, exists)
                    }
                };
                Assignment {
                    tp: tp.clone(),
                    position: resume_position(&stored, &exists),
                    stored,
                }
            })
            .collect()
    }
}
