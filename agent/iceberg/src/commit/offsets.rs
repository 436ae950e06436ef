//! Offsets: which Kafka records a table already holds.
//!
//! Every snapshot a pipeline commits carries, in its summary, the next offset to read
//! for every topic-partition the pipeline has ever written (`floe.offsets`), plus the
//! pipeline name, a writer id and a commit id. The same commit also sets the table
//! property `floe.offsets.<pipeline>` to those offsets and the id of the snapshot that
//! carries them ([`StoredOffsets`]). Maintenance snapshots (compaction) carry every
//! pipeline's offsets forward in `floe.offsets.<pipeline>` summary keys.
//!
//! Reading ([`OffsetMap::from_table`]), in this order:
//! 1. Walk `main` from the current snapshot back to the newest snapshot that carries
//!    the pipeline's offsets (its own commit or a maintenance commit). The lineage is
//!    authoritative: after a rollback it names exactly the data the table holds.
//! 2. If the walk finds none (the pipeline's snapshots were expired after another
//!    writer committed on top, which the walk cannot see past), the table property.
//!    It is ignored only when the snapshot it names still exists but is not on `main`
//!    (a rollback removed that commit from the table): then the table's data does not
//!    contain what the property covers.
//! 3. Otherwise nothing: a fresh start.
//!
//! Snapshot expiry removes snapshots, never table properties, so the offsets survive any
//! expiry, by Floe or by another engine. The consumer group's offsets are written only
//! after the Iceberg commit and are never read back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use iceberg::spec::TableMetadata;

/// A topic-partition.
pub type TopicPartition = (Arc<str>, i32);

/// A map keyed by topic-partition. Looked up for every record, so it uses a fast
/// (non-DoS-resistant) hasher; the keys come from the broker, not from message data.
pub type PartitionMap<V> = HashMap<TopicPartition, V, foldhash::fast::RandomState>;

/// Summary key holding the offsets JSON.
pub const OFFSETS_KEY: &str = "floe.offsets";
/// Summary key holding the pipeline name.
pub const PIPELINE_KEY: &str = "floe.pipeline";
/// Table property naming the pipeline that created the table: with a `topic_pattern`,
/// maintenance takes on the tables it finds only when they carry this (or the
/// pipeline's offsets property), never another writer's table that fits the name.
pub const CREATED_BY_PROPERTY: &str = "floe.created-by";
/// Summary key holding the id of the agent process that committed.
pub const WRITER_KEY: &str = "floe.writer-id";
/// Summary key holding the unique id of the commit.
pub const COMMIT_KEY: &str = "floe.commit-id";
/// Table property prefix: `floe.offsets.<pipeline>` holds [`StoredOffsets`] as JSON.
/// Maintenance snapshots use the same key in their summary (offsets only).
pub const OFFSETS_PROPERTY_PREFIX: &str = "floe.offsets.";
/// Summary key recording records lost to retention before they were read:
/// `{"topic": {"partition": [stored offset, first offset read]}}`.
pub const GAP_KEY: &str = "floe.offset-gaps";
/// Summary key recording partitions whose log restarted below the stored offset (a
/// recreated topic, an unclean leader election), whose records below it were skipped:
/// `{"topic": {"partition": [stored offset, first offset read]}}`.
pub const RESET_KEY: &str = "floe.offset-resets";

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
        #[source]
        reason: OffsetsParseError,
    },
    /// The table property holding the pipeline's offsets cannot be parsed.
    #[error("table property {key} is unreadable: {reason}")]
    UnreadableProperty {
        /// The property key.
        key: String,
        /// Why.
        #[source]
        reason: OffsetsParseError,
    },
}

/// Why stored offsets (a summary value or the table property) cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsParseError {
    /// The value is not the JSON Floe writes.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A partition key is not a partition number.
    #[error("bad partition {0:?}")]
    Partition(String),
    /// A topic's packed offsets (see [`OffsetMap::to_summary_value`]) do not decode.
    #[error("topic {topic:?}: packed offsets are damaged: {reason}")]
    Packed {
        /// The topic.
        topic: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Topics with more partitions than this are stored packed: on shared clusters a topic
/// can have thousands of partitions, and the map rides in every snapshot summary and in
/// the table property, rewritten by every commit.
pub const PACKED_ABOVE: usize = 64;

/// Prefix of a packed topic's value.
const PACKED_PREFIX: &str = "packed:";

/// Packs `(partition, offset)` pairs sorted by partition: per pair, the gap to the
/// previous partition minus one and the zigzag offset delta, as LEB128 varints, then
/// unpadded URL-safe base64. Partitions are dense and offsets of one topic are close, so
/// a partition costs 2-4 bytes instead of about 10 as JSON.
fn pack(sorted: &[(i32, i64)]) -> String {
    use base64::Engine as _;
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut bytes = Vec::with_capacity(sorted.len() * 4);
    let (mut last_partition, mut last_offset) = (-1i64, 0i64);
    for &(partition, offset) in sorted {
        varint(
            &mut bytes,
            (i64::from(partition) - last_partition - 1) as u64,
        );
        let delta = offset.wrapping_sub(last_offset);
        varint(&mut bytes, ((delta << 1) ^ (delta >> 63)) as u64);
        (last_partition, last_offset) = (i64::from(partition), offset);
    }
    let mut out = String::from(PACKED_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(&bytes, &mut out);
    out
}

/// Decodes what [`pack`] wrote (after its prefix).
fn unpack(packed: &str) -> Result<Vec<(i32, i64)>, &'static str> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(packed)
        .map_err(|_| "not base64")?;
    fn varint(input: &mut &[u8]) -> Result<u64, &'static str> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = input.split_first().ok_or("truncated")?;
            *input = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint too long")
    }
    let mut input = bytes.as_slice();
    let mut out = Vec::new();
    let (mut partition, mut offset) = (-1i64, 0i64);
    while !input.is_empty() {
        let gap = varint(&mut input)?;
        partition = i64::try_from(gap)
            .ok()
            .and_then(|gap| partition.checked_add(gap)?.checked_add(1))
            .filter(|p| *p <= i64::from(i32::MAX))
            .ok_or("partition out of range")?;
        let zigzag = varint(&mut input)?;
        offset = offset.wrapping_add(((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64));
        out.push((partition as i32, offset));
    }
    Ok(out)
}

/// The value of the table property `floe.offsets.<pipeline>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOffsets {
    /// The snapshot whose commit set these offsets.
    pub snapshot_id: i64,
    /// The offsets.
    pub offsets: OffsetMap,
}

impl StoredOffsets {
    /// `{"snapshot-id": N, "offsets": {"topic": {"partition": next}}}`.
    pub fn to_property_value(&self) -> String {
        format!(
            r#"{{"snapshot-id":{},"offsets":{}}}"#,
            self.snapshot_id,
            self.offsets.to_summary_value()
        )
    }

    /// Decodes what [`StoredOffsets::to_property_value`] wrote.
    pub fn from_property_value(s: &str) -> Result<StoredOffsets, OffsetsParseError> {
        #[derive(serde::Deserialize)]
        struct Raw {
            #[serde(rename = "snapshot-id")]
            snapshot_id: i64,
            offsets: serde_json::Value,
        }
        let raw: Raw = serde_json::from_str(s)?;
        Ok(StoredOffsets {
            snapshot_id: raw.snapshot_id,
            offsets: OffsetMap::from_summary_value(&raw.offsets.to_string())?,
        })
    }

    /// The property key of `pipeline`.
    pub fn property_key(pipeline: &str) -> String {
        format!("{OFFSETS_PROPERTY_PREFIX}{pipeline}")
    }
}

/// Where [`OffsetMap::from_table`] found a pipeline's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetsSource {
    /// A snapshot on `main`.
    Snapshot(i64),
    /// The table property (the pipeline's snapshots were expired).
    Property(i64),
    /// Nowhere: the pipeline starts fresh on this table.
    None,
}

impl OffsetMap {
    /// Encodes as `{"topic": {"partition": next_offset}}`, sorted for stable output; a
    /// topic with more than [`PACKED_ABOVE`] partitions as `{"topic": "packed:..."}`
    /// (see [`pack`]).
    pub fn to_summary_value(&self) -> String {
        let mut by_topic: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
        for ((topic, partition), offset) in &self.0 {
            by_topic
                .entry(topic)
                .or_default()
                .push((*partition, *offset));
        }
        let mut out = serde_json::Map::new();
        for (topic, mut partitions) in by_topic {
            partitions.sort_unstable();
            let value = if partitions.len() > PACKED_ABOVE {
                serde_json::Value::String(pack(&partitions))
            } else {
                partitions
                    .into_iter()
                    .map(|(p, o)| (p.to_string(), serde_json::Value::from(o)))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            };
            out.insert(topic.to_string(), value);
        }
        serde_json::Value::Object(out).to_string()
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
    pub fn from_summary_value(s: &str) -> Result<OffsetMap, OffsetsParseError> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Topic {
            Partitions(BTreeMap<String, i64>),
            Packed(String),
        }
        let parsed: BTreeMap<String, Topic> = serde_json::from_str(s)?;
        let mut map = PartitionMap::default();
        for (name, partitions) in parsed {
            let topic: Arc<str> = Arc::from(name.as_str());
            match partitions {
                Topic::Partitions(partitions) => {
                    for (p, o) in partitions {
                        let p: i32 = p.parse().map_err(|_| OffsetsParseError::Partition(p))?;
                        map.insert((topic.clone(), p), o);
                    }
                }
                Topic::Packed(value) => {
                    let pairs = value
                        .strip_prefix(PACKED_PREFIX)
                        .ok_or("no packed: prefix")
                        .and_then(unpack)
                        .map_err(|reason| OffsetsParseError::Packed {
                            topic: name.clone(),
                            reason,
                        })?;
                    map.extend(pairs.into_iter().map(|(p, o)| ((topic.clone(), p), o)));
                }
            }
        }
        Ok(OffsetMap(map))
    }

    /// The offsets the table stores for `pipeline` (see the module docs for the order
    /// of the places looked at); an empty map means a fresh start.
    pub fn from_table(metadata: &TableMetadata, pipeline: &str) -> Result<OffsetMap, OffsetsError> {
        Ok(OffsetMap::located(metadata, pipeline)?.0)
    }

    /// [`OffsetMap::from_table`], and where the offsets were found.
    pub fn located(
        metadata: &TableMetadata,
        pipeline: &str,
    ) -> Result<(OffsetMap, OffsetsSource), OffsetsError> {
        let carried_key = StoredOffsets::property_key(pipeline);
        let mut lineage = std::collections::HashSet::new();
        let mut current = metadata.current_snapshot();
        while let Some(snapshot) = current {
            lineage.insert(snapshot.snapshot_id());
            let props = &snapshot.summary().additional_properties;
            let own = (props.get(PIPELINE_KEY).map(String::as_str) == Some(pipeline))
                .then(|| props.get(OFFSETS_KEY))
                .flatten();
            if let Some(value) = own.or_else(|| props.get(&carried_key)) {
                let offsets = OffsetMap::from_summary_value(value).map_err(|reason| {
                    OffsetsError::Unreadable {
                        snapshot_id: snapshot.snapshot_id(),
                        reason,
                    }
                })?;
                return Ok((offsets, OffsetsSource::Snapshot(snapshot.snapshot_id())));
            }
            current = snapshot
                .parent_snapshot_id()
                .and_then(|id| metadata.snapshot_by_id(id));
        }
        let Some(value) = metadata.properties().get(&carried_key) else {
            return Ok((OffsetMap::default(), OffsetsSource::None));
        };
        let stored = StoredOffsets::from_property_value(value).map_err(|reason| {
            OffsetsError::UnreadableProperty {
                key: carried_key.clone(),
                reason,
            }
        })?;
        if metadata.snapshot_by_id(stored.snapshot_id).is_some()
            && !lineage.contains(&stored.snapshot_id)
        {
            tracing::warn!(
                pipeline,
                snapshot_id = stored.snapshot_id,
                "the snapshot named by {carried_key} is no longer on main (a rollback?): its offsets are ignored"
            );
            return Ok((OffsetMap::default(), OffsetsSource::None));
        }
        Ok((stored.offsets, OffsetsSource::Property(stored.snapshot_id)))
    }

    /// Every pipeline whose offsets the table stores: named by a table property or by a
    /// snapshot on `main`.
    pub fn pipelines(metadata: &TableMetadata) -> std::collections::BTreeSet<String> {
        let mut out: std::collections::BTreeSet<String> = metadata
            .properties()
            .keys()
            .filter_map(|k| k.strip_prefix(OFFSETS_PROPERTY_PREFIX))
            .map(str::to_string)
            .collect();
        let mut current = metadata.current_snapshot();
        while let Some(snapshot) = current {
            let props = &snapshot.summary().additional_properties;
            if props.contains_key(OFFSETS_KEY)
                && let Some(p) = props.get(PIPELINE_KEY)
            {
                out.insert(p.clone());
            }
            out.extend(
                props
                    .keys()
                    .filter_map(|k| k.strip_prefix(OFFSETS_PROPERTY_PREFIX))
                    .map(str::to_string),
            );
            current = snapshot
                .parent_snapshot_id()
                .and_then(|id| metadata.snapshot_by_id(id));
        }
        out
    }

    /// Summary properties that carry every pipeline's stored offsets forward
    /// (`floe.offsets.<pipeline>`), for snapshots Floe makes that are not a pipeline's
    /// own commit (maintenance).
    pub fn carried_forward(
        metadata: &TableMetadata,
    ) -> Result<std::collections::HashMap<String, String>, OffsetsError> {
        let mut out = std::collections::HashMap::new();
        for pipeline in OffsetMap::pipelines(metadata) {
            let (offsets, source) = OffsetMap::located(metadata, &pipeline)?;
            if source != OffsetsSource::None {
                out.insert(
                    StoredOffsets::property_key(&pipeline),
                    offsets.to_summary_value(),
                );
            }
        }
        Ok(out)
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
        let stored = StoredOffsets {
            snapshot_id: 42,
            offsets: m,
        };
        let v = stored.to_property_value();
        assert_eq!(
            v,
            r#"{"snapshot-id":42,"offsets":{"a.b":{"1":0},"orders":{"0":10,"3":7}}}"#
        );
        assert_eq!(StoredOffsets::from_property_value(&v).unwrap(), stored);
    }

    #[test]
    fn many_partitions_are_packed_and_round_trip() {
        let mut m = OffsetMap::default();
        // 2,000 partitions with a gap, offsets up and down, one huge and one zero.
        for p in (0..2_100).filter(|p| !(500..600).contains(p)) {
            m.0.insert(
                (Arc::from("big"), p),
                1_000_000 + i64::from(p % 7) * 13 - 40,
            );
        }
        m.0.insert((Arc::from("big"), 7), i64::MAX);
        m.0.insert((Arc::from("big"), 8), 0);
        m.0.insert((Arc::from("small"), 2), 5);
        let s = m.to_summary_value();
        assert!(s.starts_with(r#"{"big":"packed:"#), "{}", &s[..40]);
        assert!(s.ends_with(r#","small":{"2":5}}"#), "{s}");
        assert!(s.len() < 2_000 * 4, "{} bytes", s.len());
        assert_eq!(OffsetMap::from_summary_value(&s).unwrap(), m);
        let stored = StoredOffsets {
            snapshot_id: 1,
            offsets: m,
        };
        let v = stored.to_property_value();
        assert_eq!(StoredOffsets::from_property_value(&v).unwrap(), stored);

        // An agent that predates packing refuses the value (it stops rather than
        // reading from the start): its decoder expects a map per topic.
        let old: Result<BTreeMap<String, BTreeMap<String, i64>>, _> = serde_json::from_str(&s);
        assert!(old.is_err());
    }

    #[test]
    fn a_damaged_packed_topic_is_an_error() {
        for bad in [
            r#"{"t":"packed:!!"}"#,
            r#"{"t":"packed:gA"}"#,
            r#"{"t":"nopack"}"#,
            r#"{"t":"packed:_____________w"}"#,
            // A gap past i32::MAX.
            r#"{"t":"packed:gICAgBAA"}"#,
        ] {
            let err = OffsetMap::from_summary_value(bad).unwrap_err();
            assert!(
                matches!(&err, OffsetsParseError::Packed { topic, .. } if topic == "t"),
                "{bad}: {err}"
            );
        }
    }
}
