//! Where newly assigned partitions start: the offsets the tables store, read fresh from
//! the catalog when the partitions are assigned.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use iceberg::{NamespaceIdent, TableIdent};

use crate::config::PipelineConfig;
use crate::record::TopicPartition;
use crate::sink::TableSink;
use crate::source::{Assignment, KnownOffsets, PositionLookup, resume_position};
use floe_iceberg::CatalogHandle;
use floe_iceberg::OffsetMap;

use super::tables::TableMap;

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
    namespace: NamespaceIdent,
    map: Arc<TableMap>,
    pipeline: String,
    known: Arc<KnownOffsets>,
    runtime: tokio::runtime::Handle,
}

impl TablePositions {
    pub(super) fn new(
        config: &PipelineConfig,
        map: Arc<TableMap>,
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
        TablePositions {
            catalog,
            namespace,
            map,
            pipeline: config.name.clone(),
            known,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Per table index asked for: its stored offsets, `None` when it does not exist yet.
    async fn read(
        &self,
        tables: &BTreeSet<usize>,
    ) -> Result<HashMap<usize, Option<OffsetMap>>, String> {
        let mut out = HashMap::with_capacity(tables.len());
        for &i in tables {
            let ident = TableIdent::new(self.namespace.clone(), self.map.name(i));
            let offsets = match self.catalog.catalog.load_table(&ident).await {
                Ok(t) => Some(
                    OffsetMap::from_table(t.metadata(), &self.pipeline)
                        .map_err(|e| e.to_string())?,
                ),
                Err(e) if floe_iceberg::is_not_found(&e) => None,
                Err(e) => return Err(e.to_string()),
            };
            out.insert(i, offsets);
        }
        Ok(out)
    }
}

impl PositionLookup for TablePositions {
    fn lookup(&self, tps: &[TopicPartition]) -> Vec<Assignment> {
        // Only the tables that store these partitions' offsets are read (with a table
        // per topic, a new topic gets its table here).
        let covering: Vec<Range<usize>> = tps.iter().map(|tp| self.map.covering(tp)).collect();
        let wanted: BTreeSet<usize> = covering.iter().cloned().flatten().collect();
        let fresh = self
            .runtime
            .block_on(async { tokio::time::timeout(FRESH_READ_TIMEOUT, self.read(&wanted)).await });
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
        let n = self.map.len();
        let known = self.known.lock().expect("known offsets");
        tps.iter()
            .zip(covering)
            .map(|(tp, tables)| {
                let mut stored = vec![None; n];
                let mut exists = vec![false; n];
                for i in tables {
                    match &fresh {
                        Some(read) => {
                            if let Some(Some(offsets)) = read.get(&i) {
                                stored[i] = offsets.0.get(tp).copied();
                                exists[i] = true;
                            }
                        }
                        None => stored[i] = known.get(tp).and_then(|k| k.get(i).copied().flatten()),
                    }
                }
                Assignment {
                    tp: tp.clone(),
                    position: resume_position(&stored, &exists),
                    stored,
                }
            })
            .collect()
    }
}
