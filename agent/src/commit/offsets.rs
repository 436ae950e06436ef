//! Offsets: which Kafka records a table already holds.
//!
//! Every snapshot a pipeline commits carries, in its summary, the next offset to read
//! for every topic-partition the pipeline has ever written (`floe.offsets`), plus the
//! pipeline name, a writer id and a commit id. On start, and after a fenced commit,
//! the agent walks the table's snapshot history from the current snapshot back to the
//! newest one of its pipeline and resumes exactly there. The consumer group's offsets
//! are written only after the Iceberg commit and are never read back.

use std::collections::BTreeMap;
use std::sync::Arc;

use iceberg::spec::TableMetadata;

use crate::record::PartitionMap;

/// Summary key holding the offsets JSON.
pub const OFFSETS_KEY: &str = "floe.offsets";
/// Summary key holding the pipeline name.
pub const PIPELINE_KEY: &str = "floe.pipeline";
/// Summary key holding the id of the agent process that committed.
pub const WRITER_KEY: &str = "floe.writer-id";
/// Summary key holding the unique id of the commit.
pub const COMMIT_KEY: &str = "floe.commit-id";
/// Summary key recording records lost to retention before they were read:
/// `{"topic": {"partition": [stored offset, first offset read]}}`.
pub const GAP_KEY: &str = "floe.offset-gaps";

/// Next offset to read per topic-partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetMap(pub PartitionMap<i64>);

/// Errors reading stored offsets.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    /// A snapshot of our pipeline carries offsets we cannot parse.
    #[error("snapshot {snapshot_id} has unreadable {OFFSETS_KEY}: {reason}")]
    Unreadable {
        /// The snapshot.
        snapshot_id: i64,
        /// Why.
        reason: String,
    },
}

impl OffsetMap {
    /// Encodes as `{"topic": {"partition": next_offset}}`, sorted for stable output.
    pub fn to_summary_value(&self) -> String {
        let mut sorted: BTreeMap<&str, BTreeMap<String, i64>> = BTreeMap::new();
        for ((topic, partition), offset) in &self.0 {
            sorted
                .entry(topic)
                .or_default()
                .insert(partition.to_string(), *offset);
        }
        serde_json::to_string(&sorted).expect("offsets serialize")
    }

    /// These offsets with `update` laid over them (per partition, the larger one: stored
    /// offsets never go back).
    pub fn merged(&self, update: &OffsetMap) -> OffsetMap {
        let mut out = self.clone();
        for (tp, o) in &update.0 {
            let e = out.0.entry(tp.clone()).or_insert(*o);
            *e = (*e).max(*o);
        }
        out
    }

    /// Decodes what [`OffsetMap::to_summary_value`] wrote.
    pub fn from_summary_value(s: &str) -> Result<OffsetMap, String> {
        let parsed: BTreeMap<String, BTreeMap<String, i64>> =
            serde_json::from_str(s).map_err(|e| e.to_string())?;
        let mut map = PartitionMap::default();
        for (topic, partitions) in parsed {
            let topic: Arc<str> = Arc::from(topic);
            for (p, o) in partitions {
                let p: i32 = p.parse().map_err(|_| format!("bad partition {p:?}"))?;
                map.insert((topic.clone(), p), o);
            }
        }
        Ok(OffsetMap(map))
    }

    /// The offsets the newest snapshot of `pipeline` stored, following the `main` lineage.
    /// Snapshots of other writers in between are skipped; an empty map means a fresh start.
    pub fn from_table(metadata: &TableMetadata, pipeline: &str) -> Result<OffsetMap, OffsetsError> {
        let mut current = metadata.current_snapshot();
        while let Some(snapshot) = current {
            let props = &snapshot.summary().additional_properties;
            if props.get(PIPELINE_KEY).map(String::as_str) == Some(pipeline)
                && let Some(value) = props.get(OFFSETS_KEY)
            {
                return OffsetMap::from_summary_value(value).map_err(|reason| {
                    OffsetsError::Unreadable {
                        snapshot_id: snapshot.snapshot_id(),
                        reason,
                    }
                });
            }
            current = snapshot
                .parent_snapshot_id()
                .and_then(|id| metadata.snapshot_by_id(id));
        }
        Ok(OffsetMap::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_value_round_trips() {
        let mut m = OffsetMap::default();
        m.0.insert((Arc::from("orders"), 0), 10);
        m.0.insert((Arc::from("orders"), 3), 7);
        m.0.insert((Arc::from("a.b"), 1), 0);
        let s = m.to_summary_value();
        assert_eq!(s, r#"{"a.b":{"1":0},"orders":{"0":10,"3":7}}"#);
        assert_eq!(OffsetMap::from_summary_value(&s).unwrap(), m);
        assert!(OffsetMap::from_summary_value("{\"t\":{\"x\":1}}").is_err());
    }
}
