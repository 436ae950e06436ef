//! The record a plugin sees.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::Error;
use crate::json::{FieldRef, Fields, Json};

/// One record going into a plugin: the value (a JSON object, read lazily) and its
/// Kafka metadata. Everything borrows the batch buffer: nothing is copied or parsed
/// until you read it.
///
/// ```
/// use floe_sdk::Record;
///
/// let record = Record::from_json(br#"{"id": 7, "user": {"name": "ann"}}"#);
/// assert_eq!(record.get("id").and_then(|v| v.as_i64()), Some(7));
/// assert_eq!(record.get("user.name").unwrap().as_str().unwrap(), "ann");
/// assert_eq!(record.offset(), 0);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    value: Json<'a>,
    /// The value's text as sent, and its field index (empty: none, so fields are
    /// found by scanning the text).
    text: &'a [u8],
    index: &'a [u8],
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp_ms: Option<i64>,
    key: Option<&'a [u8]>,
}

impl<'a> Record<'a> {
    /// A record from its parts (the SDK builds them; this is for your own tests).
    pub fn new(
        value: &'a [u8],
        topic: &'a str,
        partition: i32,
        offset: i64,
        timestamp_ms: Option<i64>,
        key: Option<&'a [u8]>,
    ) -> Record<'a> {
        Record {
            value: Json::new(value),
            text: value,
            index: &[],
            topic,
            partition,
            offset,
            timestamp_ms,
            key,
        }
    }

    /// The same record with the field index the host sent (offsets into the value's
    /// text as sent): its top-level fields are then read without scanning.
    pub(crate) fn with_index(mut self, index: Option<&'a [u8]>) -> Record<'a> {
        self.index = index.unwrap_or_default();
        self
    }

    /// A record with this JSON text and empty metadata (topic `""`, offset 0).
    pub fn from_json(value: &'a [u8]) -> Record<'a> {
        Record::new(value, "", 0, 0, None, None)
    }

    /// The value: a JSON object.
    pub fn value(&self) -> Json<'a> {
        self.value
    }

    /// The value at a path of keys (see [`FieldRef`]): `"paid"`, `"user.name"`, or a
    /// parsed [`FieldPath`](crate::path::FieldPath). The top-level field is found
    /// through the agent's field index without scanning the text (by scanning up to it
    /// for a record built here); below it, only the text of the objects on the path is
    /// scanned, up to the field.
    pub fn get(&self, path: impl FieldRef) -> Option<Json<'a>> {
        if self.index.is_empty() {
            return self.value.get(path);
        }
        let mut keys = path.keys();
        let Some(first) = keys.next() else {
            return Some(self.value);
        };
        let (_, mut current) = self.fields().find(|(key, _)| key.is(first))?;
        for key in keys {
            current = current.field(key)?;
        }
        Some(current)
    }

    /// The top-level fields in order.
    pub fn fields(&self) -> Fields<'a> {
        if self.index.is_empty() {
            return self.value.fields();
        }
        Fields::indexed(self.text, self.index)
    }

    /// The value's JSON text, as it arrived.
    pub fn json(&self) -> &'a [u8] {
        self.value.bytes()
    }

    /// The whole value as a `serde_json` map (parses the whole record: use it when you
    /// really need every field).
    pub fn to_map(&self) -> Result<Map<String, Value>, Error> {
        match self.value.to_value()? {
            Value::Object(map) => Ok(map),
            _ => Err(Error::msg("the record is not a JSON object")),
        }
    }

    /// The whole value deserialized into a type of your own (parses the whole record).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        self.value.parse()
    }

    /// Topic the message was read from.
    pub fn topic(&self) -> &'a str {
        self.topic
    }

    /// Partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Offset in the partition.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// Message timestamp in milliseconds since the Unix epoch, if known.
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.timestamp_ms
    }

    /// Message key bytes, if any (with `key_format = "json"` or `"avro"`, the key's JSON
    /// text; a string key as the plain string).
    pub fn key(&self) -> Option<&'a [u8]> {
        self.key
    }
}

/// Kafka metadata of a record, owned (for [`testing`](crate::testing)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Topic the message was read from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Message timestamp in milliseconds since the Unix epoch, if known.
    pub timestamp_ms: Option<i64>,
    /// Message key bytes, if any.
    pub key: Option<Vec<u8>>,
}
