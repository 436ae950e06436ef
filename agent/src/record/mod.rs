//! Records as they travel through the stages, below every stage.
//!
//! - [`Message`]: one Kafka message as read (its original bytes travel to the
//!   dead-letter path whatever happens to the record later).
//! - [`TopicPartition`] and [`PartitionMap`]: per-partition bookkeeping.
//! - [`columns`]: the `_kafka_*` metadata columns every table gets, and their Iceberg fields.

pub mod columns;
pub mod json;
pub mod key;
pub mod values;

use std::sync::Arc;

pub use floe_iceberg::{PartitionMap, TopicPartition};

/// One Kafka message as read, with everything the dead-letter path and the metadata
/// columns need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Message timestamp in milliseconds since the epoch, if the broker gave one.
    pub timestamp_ms: Option<i64>,
    /// Message key bytes.
    pub key: Option<Vec<u8>>,
    /// Message value bytes; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// Record headers in order: name and value (`None`: a null value).
    pub headers: Vec<Header>,
}

/// A record header: name and value (`None`: a null value).
pub type Header = (String, Option<Vec<u8>>);

impl Message {
    /// Its topic-partition.
    pub fn topic_partition(&self) -> TopicPartition {
        (self.topic.clone(), self.partition)
    }

    /// Bytes of its headers' names and values: memory bounds count them with the key
    /// and value (a producer may send megabytes of headers).
    pub fn header_bytes(&self) -> usize {
        self.headers
            .iter()
            .map(|(name, value)| name.len() + value.as_ref().map_or(0, Vec::len))
            .sum()
    }
}

/// A short name of a JSON value's kind, for error messages.
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number with fraction",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_count_towards_a_message_size() {
        let m = Message {
            topic: Arc::from("t"),
            partition: 0,
            offset: 0,
            timestamp_ms: None,
            key: None,
            value: Some(b"{}".to_vec()),
            headers: vec![
                ("trace".into(), Some(vec![0; 1000])),
                ("empty".into(), None),
            ],
        };
        assert_eq!(m.header_bytes(), 5 + 1000 + 5);
    }
}
