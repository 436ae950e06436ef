//! The metadata columns the agent adds to every row, in table order.

use std::sync::Arc;

use iceberg::spec::{MapType, NestedField, NestedFieldRef, PrimitiveType, Type};

/// Kafka partition of the message (int, required).
pub const PARTITION: &str = "_kafka_partition";
/// Kafka offset of the message (long, required).
pub const OFFSET: &str = "_kafka_offset";
/// Message timestamp (timestamptz).
pub const TIMESTAMP: &str = "_kafka_timestamp";
/// Message key as text (string).
pub const KEY: &str = "_kafka_key";
/// Topic of the message (string): in tables created with `topic_column` on.
pub const TOPIC: &str = "_kafka_topic";
/// Record headers (map of string to binary): in tables created with `headers_column` on.
pub const HEADERS: &str = "_kafka_headers";
/// Upsert tables only: `insert` or `update` (string).
pub const OP: &str = "_op";

/// Columns the agent adds to rows; payload fields with these names are ignored.
/// `_op` exists in upsert tables only, `_kafka_topic` and `_kafka_headers` with their
/// settings only.
pub const RESERVED: [&str; 7] = [PARTITION, OFFSET, TIMESTAMP, KEY, TOPIC, HEADERS, OP];

/// Whether `name` is one of the agent's own top-level columns.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name)
}

/// The `_kafka_*` fields of a new table, with ids from `id`: partition, offset,
/// timestamp, key and, with `topic`, the topic, with `headers`, the headers.
pub fn kafka_fields(
    id: &mut impl FnMut() -> i32,
    topic: bool,
    headers: bool,
) -> Vec<NestedFieldRef> {
    let mut fields = vec![
        Arc::new(NestedField::required(
            id(),
            PARTITION,
            Type::Primitive(PrimitiveType::Int),
        )),
        Arc::new(NestedField::required(
            id(),
            OFFSET,
            Type::Primitive(PrimitiveType::Long),
        )),
        Arc::new(NestedField::optional(
            id(),
            TIMESTAMP,
            Type::Primitive(PrimitiveType::Timestamptz),
        )),
        Arc::new(NestedField::optional(
            id(),
            KEY,
            Type::Primitive(PrimitiveType::String),
        )),
    ];
    if topic {
        fields.push(Arc::new(NestedField::optional(
            id(),
            TOPIC,
            Type::Primitive(PrimitiveType::String),
        )));
    }
    if headers {
        let field = id();
        let map = MapType::new(
            Arc::new(NestedField::map_key_element(
                id(),
                Type::Primitive(PrimitiveType::String),
            )),
            Arc::new(NestedField::map_value_element(
                id(),
                Type::Primitive(PrimitiveType::Binary),
                false,
            )),
        );
        fields.push(Arc::new(NestedField::optional(
            field,
            HEADERS,
            Type::Map(map),
        )));
    }
    fields
}
