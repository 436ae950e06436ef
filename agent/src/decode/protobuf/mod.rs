//! Protobuf values -> the JSON text of the record, with the columns the message declares.
//!
//! Schemas come from the registry (schema type `PROTOBUF`: `.proto` text or a
//! base64-encoded `FileDescriptorProto`, with references to other subjects and the
//! well-known `google/protobuf/*.proto` files), from a `.proto` file, or from a
//! descriptor set (`protoc --include_imports --descriptor_set_out`). `.proto` text is
//! parsed at run time by protox; messages are decoded by prost-reflect.
//!
//! Confluent wire format: magic byte 0, 4-byte big-endian schema id, then the message
//! indexes (which message of the schema file: a zig-zag varint count followed by that
//! many zig-zag varint indexes into the nested message lists; the single byte 0 stands
//! for `[0]`, the first top-level message), then the message bytes.
//!
//! The JSON conventions follow the Avro path (see `docs/types.md`): bytes as lowercase
//! hex, `Timestamp` as ISO-8601 UTC with `Z`, uint64 as an exact decimal string, enums
//! as their names. A field with explicit presence (message, oneof member, `optional`) is
//! null when absent; an absent proto3 scalar without `optional` is its default value
//! (`0`, `""`, `false`, the enum's zero value), as every protobuf reader sees it: the
//! wire format cannot tell it from an explicit zero.

mod types;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use iceberg::spec::StructType;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FileDescriptor, MapKey, MessageDescriptor, Value as PValue,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

pub use self::types::ProtoMappingError;
use self::types::{Cardinality, FieldPlan, JsonTextKind, Member, MessagePlan, ValuePlan};
use super::DecodeError;
use super::text;

/// Deepest message-index path accepted in a Confluent header (nesting of message types).
const MAX_INDEX_DEPTH: usize = 32;

/// One message type, ready to decode: its descriptor, its plan and its columns.
#[derive(Debug)]
pub struct ProtoMessage {
    descriptor: MessageDescriptor,
    plan: MessagePlan,
    /// The columns it declares, with their exact Iceberg types (placeholder ids 0).
    pub columns: Arc<StructType>,
}

impl ProtoMessage {
    /// Prepares `descriptor` for decoding; fails for recursive messages.
    pub fn new(descriptor: MessageDescriptor) -> Result<ProtoMessage, ProtoMappingError> {
        let plan = MessagePlan::new(&descriptor)?;
        Ok(ProtoMessage {
            columns: Arc::new(plan.columns()),
            plan,
            descriptor,
        })
    }

    /// The message's full name (`package.Message`).
    pub fn full_name(&self) -> &str {
        self.descriptor.full_name()
    }

    /// Decodes one message (no header) and appends its JSON object text to `out`.
    pub fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let message = DynamicMessage::decode(self.descriptor.clone(), bytes).map_err(|e| {
            DecodeError::NotProtobuf(format!("{} does not decode: {e}", self.full_name()))
        })?;
        write_message(&self.plan, &message, out)
            .map_err(|e| DecodeError::NotProtobuf(e.to_string()))
    }
}

/// A schema file from the registry (or config): its messages by Confluent message index.
#[derive(Debug)]
pub struct ProtoSchema {
    /// Registry id (`None` for a schema from config).
    pub id: Option<u32>,
    file: FileDescriptor,
    /// Every message of the file by its index path; a recursive one maps to its error.
    messages: HashMap<Vec<i32>, Result<Arc<ProtoMessage>, ProtoMappingError>>,
}

/// A schema text from the registry: `.proto` source, or a base64 `FileDescriptorProto`
/// (what the registry returns with `format=serialized`, and what Confluent's Python
/// serializer registers).
fn registry_file(name: &str, text: &str) -> Result<File, protox::Error> {
    let looks_base64 = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if looks_base64
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text)
        && let Ok(file) = File::decode_file_descriptor_proto(bytes.as_slice())
    {
        let mut descriptor = file.file_descriptor_proto().clone();
        // The registry knows a file by its reference name (the import path).
        descriptor.name = Some(name.to_string());
        return Ok(File::from_file_descriptor_proto(descriptor));
    }
    File::from_source(name, text)
}

/// Resolves imports from the files the registry gave (by reference name), then the
/// well-known types.
struct RegistryFiles(HashMap<String, File>);

impl FileResolver for RegistryFiles {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| protox::Error::file_not_found(name))
    }
}

impl ProtoSchema {
    /// A schema from the registry: `text` is the schema of `id`, `references` the
    /// (import name, schema text) of every file it imports, transitively.
    pub fn from_registry(
        id: u32,
        text: &str,
        references: &[(String, String)],
    ) -> Result<ProtoSchema, DecodeError> {
        let bad = |reason: String| DecodeError::BadSchema {
            id: Some(id),
            reason,
        };
        let unparsed = |e: protox::Error| bad(format!("Protobuf schema does not parse: {e}"));
        let mut files = HashMap::new();
        for (name, text) in references {
            files.insert(name.clone(), registry_file(name, text).map_err(unparsed)?);
        }
        // The main file's name only has to differ from the imported ones.
        let main = format!("floe-registry/schema-{id}.proto");
        files.insert(main.clone(), registry_file(&main, text).map_err(unparsed)?);
        let mut resolver = ChainFileResolver::new();
        resolver.add(RegistryFiles(files));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler
            .open_file(&main)
            .map_err(|e| bad(format!("Protobuf schema does not compile: {e}")))?;
        let pool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(&main)
            .ok_or_else(|| bad("compiled schema lost its file".into()))?;
        Ok(ProtoSchema::index(Some(id), file))
    }

    fn index(id: Option<u32>, file: FileDescriptor) -> ProtoSchema {
        fn walk(
            path: &mut Vec<i32>,
            message: MessageDescriptor,
            out: &mut HashMap<Vec<i32>, Result<Arc<ProtoMessage>, ProtoMappingError>>,
        ) {
            for (i, child) in message.child_messages().enumerate() {
                path.push(i as i32);
                walk(path, child, out);
                path.pop();
            }
            out.insert(path.clone(), ProtoMessage::new(message).map(Arc::new));
        }
        let mut messages = HashMap::new();
        for (i, message) in file.messages().enumerate() {
            walk(&mut vec![i as i32], message, &mut messages);
        }
        ProtoSchema { id, file, messages }
    }

    /// The message a Confluent message-index path names.
    pub fn message(&self, indexes: &[i32]) -> Result<Arc<ProtoMessage>, DecodeError> {
        match self.messages.get(indexes) {
            Some(Ok(m)) => Ok(m.clone()),
            Some(Err(reason)) => Err(DecodeError::BadSchema {
                id: self.id,
                reason: reason.to_string(),
            }),
            None => Err(DecodeError::NotProtobuf(format!(
                "message index {indexes:?} names no message of schema {}",
                self.id
                    .map_or_else(|| self.file.name().to_string(), |i| format!("id {i}"))
            ))),
        }
    }
}

/// Where a plain Protobuf schema comes from (config).
#[derive(Debug, Clone)]
pub enum ProtoSource {
    /// A `.proto` file, imports looked up in these directories (then the well-known types).
    ProtoFile {
        /// The file.
        path: PathBuf,
        /// Import directories; the file's own directory when empty.
        import_paths: Vec<PathBuf>,
    },
    /// A binary `FileDescriptorSet` with every imported file included.
    DescriptorSet(PathBuf),
}

/// Loads the descriptor pool of a plain Protobuf schema.
pub fn load_pool(source: &ProtoSource) -> Result<DescriptorPool, DecodeError> {
    let file_err = |path: &Path, reason: String| DecodeError::SchemaFile {
        path: path.display().to_string(),
        reason,
    };
    match source {
        ProtoSource::ProtoFile { path, import_paths } => {
            let includes = if import_paths.is_empty() {
                vec![
                    path.parent()
                        .filter(|p| !p.as_os_str().is_empty())
                        .unwrap_or(Path::new("."))
                        .to_path_buf(),
                ]
            } else {
                import_paths.clone()
            };
            let mut compiler =
                protox::Compiler::new(&includes).map_err(|e| file_err(path, e.to_string()))?;
            compiler
                .open_file(path)
                .map_err(|e| file_err(path, e.to_string()))?;
            Ok(compiler.descriptor_pool())
        }
        ProtoSource::DescriptorSet(path) => {
            let bytes = std::fs::read(path).map_err(|e| file_err(path, e.to_string()))?;
            DescriptorPool::decode(bytes.as_slice())
                .map_err(|e| file_err(path, format!("not a FileDescriptorSet: {e}")))
        }
    }
}

/// The message `name` (fully qualified, a leading `.` allowed) of a plain schema.
pub fn plain_message(pool: &DescriptorPool, name: &str) -> Result<Arc<ProtoMessage>, DecodeError> {
    let name = name.trim_start_matches('.');
    let descriptor = pool
        .get_message_by_name(name)
        .ok_or_else(|| DecodeError::BadSchema {
            id: None,
            reason: format!(
                "no message `{name}` in the Protobuf schema (known: {})",
                pool.all_messages()
                    .filter(|m| !m.full_name().starts_with("google.protobuf."))
                    .map(|m| m.full_name().to_string())
                    .take(20)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
    ProtoMessage::new(descriptor)
        .map(Arc::new)
        .map_err(|e| DecodeError::BadSchema {
            id: None,
            reason: e.to_string(),
        })
}

/// The message indexes at the start of a Confluent Protobuf body (after the 5-byte header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageIndexes {
    buf: [i32; MAX_INDEX_DEPTH],
    len: usize,
}

impl MessageIndexes {
    /// The index path.
    pub fn as_slice(&self) -> &[i32] {
        &self.buf[..self.len]
    }
}

fn zigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

/// Splits the message-index list off a Confluent Protobuf body.
pub fn split_message_indexes(body: &[u8]) -> Result<(MessageIndexes, &[u8]), DecodeError> {
    let err = |what: String| DecodeError::NotProtobuf(format!("message indexes: {what}"));
    let mut rest = body;
    let varint = |rest: &mut &[u8]| {
        prost::encoding::decode_varint(rest)
            .map(zigzag)
            .map_err(|e| err(e.to_string()))
    };
    let count = varint(&mut rest)?;
    let mut out = MessageIndexes {
        buf: [0; MAX_INDEX_DEPTH],
        len: 1,
    };
    if count == 0 {
        // The single byte 0 stands for [0].
        return Ok((out, rest));
    }
    if count < 0 || count as usize > MAX_INDEX_DEPTH {
        return Err(err(format!(
            "count {count} is not between 1 and {MAX_INDEX_DEPTH}"
        )));
    }
    out.len = count as usize;
    for slot in out.buf.iter_mut().take(count as usize) {
        let i = varint(&mut rest)?;
        if !(0..=i32::MAX as i64).contains(&i) {
            return Err(err(format!("index {i} is negative or too large")));
        }
        *slot = i as i32;
    }
    Ok((out, rest))
}

// ------------------------------------------------------------------ writing JSON text

/// Why a decoded message cannot be written as JSON text: its values do not fit the
/// plan made from its schema.
#[derive(Debug, thiserror::Error)]
enum ValueError {
    /// A field's value is not of its declared cardinality (single, list, map).
    #[error("field {field} holds {value}, not its declared cardinality")]
    Cardinality {
        /// The field's name.
        field: String,
        /// The value it holds (debug form).
        value: String,
    },
    /// A value does not match its field's type.
    #[error("value {value} does not match its field ({plan})")]
    Mismatch {
        /// The value (debug form).
        value: String,
        /// What the schema declares (debug form).
        plan: String,
    },
    /// A `Timestamp` or `Duration` beyond what microseconds since the epoch hold.
    #[error("{0} out of range")]
    OutOfRange(&'static str),
    /// A `Timestamp` outside the years a timestamp column holds.
    #[error("Timestamp {0}s out of range")]
    TimestampOutOfRange(i64),
    /// A well-known type whose fields are not as the spec says.
    #[error("{0}")]
    Malformed(&'static str),
    /// A `google.protobuf.Value` member that is none of its kinds.
    #[error("unexpected Value member {0}")]
    UnexpectedMember(String),
    /// A `google.protobuf.Value` nested too deep.
    #[error("google.protobuf.Value nested deeper than 64 levels")]
    TooDeep,
    /// The JSON text of a `Struct`, `Value` or `ListValue` is not UTF-8.
    #[error("{0}")]
    NotUtf8(#[source] std::str::Utf8Error),
}

fn write_message(
    plan: &MessagePlan,
    message: &DynamicMessage,
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    out.push(b'{');
    let mut first = true;
    for member in &plan.members {
        match member {
            Member::Field(f) => {
                if matches!(f.value, ValuePlan::Nothing) {
                    continue;
                }
                sep(out, &mut first);
                out.extend_from_slice(f.key.as_bytes());
                write_field(f, message, out)?;
            }
            Member::Oneof { key, fields, .. } => {
                sep(out, &mut first);
                out.extend_from_slice(key.as_bytes());
                match fields.iter().find(|f| message.has_field(&f.field)) {
                    Some(f) if !matches!(f.value, ValuePlan::Nothing) => {
                        out.push(b'{');
                        out.extend_from_slice(f.key.as_bytes());
                        write_field(f, message, out)?;
                        out.push(b'}');
                    }
                    _ => out.extend_from_slice(b"null"),
                }
            }
        }
    }
    out.push(b'}');
    Ok(())
}

fn sep(out: &mut Vec<u8>, first: &mut bool) {
    if !*first {
        out.push(b',');
    }
    *first = false;
}

fn write_field(
    f: &FieldPlan,
    message: &DynamicMessage,
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    if f.presence && !message.has_field(&f.field) {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    let value = message.get_field(&f.field);
    match (f.cardinality, &*value) {
        (Cardinality::Single, v) => write_value(&f.value, v, out),
        (Cardinality::List, PValue::List(items)) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(&f.value, item, out)?;
            }
            out.push(b']');
            Ok(())
        }
        (Cardinality::Map, PValue::Map(entries)) => {
            // Sorted keys: the text of a record does not depend on hash order.
            let mut entries: Vec<(&MapKey, &PValue)> = entries.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match k {
                    MapKey::String(s) => text::string(out, s),
                    MapKey::Bool(b) => text::string(out, if *b { "true" } else { "false" }),
                    MapKey::I32(n) => text::string(out, &n.to_string()),
                    MapKey::I64(n) => text::string(out, &n.to_string()),
                    MapKey::U32(n) => text::string(out, &n.to_string()),
                    MapKey::U64(n) => text::string(out, &n.to_string()),
                }
                out.push(b':');
                write_value(&f.value, v, out)?;
            }
            out.push(b'}');
            Ok(())
        }
        (_, other) => Err(ValueError::Cardinality {
            field: f.field.name().to_string(),
            value: format!("{other:?}"),
        }),
    }
}

fn write_value(plan: &ValuePlan, v: &PValue, out: &mut Vec<u8>) -> Result<(), ValueError> {
    match (plan, v) {
        (ValuePlan::Double, PValue::F64(f)) => text::double(out, *f),
        (ValuePlan::Float, PValue::F32(f)) => text::float(out, *f),
        (ValuePlan::Int | ValuePlan::Long, PValue::I32(n)) => text::int(out, *n),
        (ValuePlan::Long, PValue::I64(n)) => text::int(out, *n),
        (ValuePlan::Long, PValue::U32(n)) => text::int(out, *n),
        (ValuePlan::Unsigned64, PValue::U64(n)) => {
            out.push(b'"');
            text::int(out, *n);
            out.push(b'"');
        }
        (ValuePlan::Bool, PValue::Bool(b)) => {
            out.extend_from_slice(if *b { b"true" } else { b"false" })
        }
        (ValuePlan::String, PValue::String(s)) => text::string(out, s),
        (ValuePlan::Bytes, PValue::Bytes(b)) => text::hex(out, b),
        (ValuePlan::Enum(e), PValue::EnumNumber(n)) => match e.get_value(*n) {
            Some(value) => text::string(out, value.name()),
            // An open enum's value this schema does not know: its number.
            None => text::string(out, &n.to_string()),
        },
        (ValuePlan::Message(plan), PValue::Message(m)) => write_message(plan, m, out)?,
        (ValuePlan::Timestamp, PValue::Message(m)) => {
            let (seconds, nanos) = seconds_nanos(m);
            let micros = seconds
                .checked_mul(1_000_000)
                .and_then(|us| us.checked_add(nanos / 1000))
                .ok_or(ValueError::OutOfRange("Timestamp"))?;
            if !text::timestamp_micros(out, micros) {
                return Err(ValueError::TimestampOutOfRange(seconds));
            }
        }
        (ValuePlan::Duration, PValue::Message(m)) => {
            let (seconds, nanos) = seconds_nanos(m);
            let micros = seconds
                .checked_mul(1_000_000)
                .and_then(|us| us.checked_add(nanos / 1000))
                .ok_or(ValueError::OutOfRange("Duration"))?;
            text::int(out, micros);
        }
        (ValuePlan::Wrapper(inner), PValue::Message(m)) => {
            let value = m
                .get_field_by_number(1)
                .ok_or(ValueError::Malformed("wrapper without field 1"))?;
            write_value(inner, &value, out)?;
        }
        (ValuePlan::JsonText(kind), PValue::Message(m)) => {
            let mut json = Vec::new();
            write_json_like(*kind, m, &mut json, 0)?;
            text::string(
                out,
                std::str::from_utf8(&json).map_err(ValueError::NotUtf8)?,
            );
        }
        (ValuePlan::Nothing, _) => out.extend_from_slice(b"null"),
        (plan, v) => {
            return Err(ValueError::Mismatch {
                value: format!("{v:?}"),
                plan: format!("{plan:?}"),
            });
        }
    }
    Ok(())
}

fn seconds_nanos(m: &DynamicMessage) -> (i64, i64) {
    let seconds = match m.get_field_by_number(1).as_deref() {
        Some(PValue::I64(s)) => *s,
        _ => 0,
    };
    let nanos = match m.get_field_by_number(2).as_deref() {
        Some(PValue::I32(n)) => *n as i64,
        _ => 0,
    };
    (seconds, nanos)
}

/// The protobuf JSON of `google.protobuf.Struct`, `Value` and `ListValue`.
fn write_json_like(
    kind: JsonTextKind,
    m: &DynamicMessage,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), ValueError> {
    if depth > 64 {
        return Err(ValueError::TooDeep);
    }
    match kind {
        JsonTextKind::Struct => {
            let fields = m
                .get_field_by_number(1)
                .ok_or(ValueError::Malformed("Struct without fields"))?;
            let PValue::Map(entries) = &*fields else {
                return Err(ValueError::Malformed("Struct.fields is not a map"));
            };
            let mut entries: Vec<_> = entries.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let MapKey::String(k) = k else {
                    return Err(ValueError::Malformed("Struct key is not a string"));
                };
                text::string(out, k);
                out.push(b':');
                let PValue::Message(v) = v else {
                    return Err(ValueError::Malformed("Struct value is not a Value"));
                };
                write_json_like(JsonTextKind::Value, v, out, depth + 1)?;
            }
            out.push(b'}');
        }
        JsonTextKind::ListValue => {
            let values = m
                .get_field_by_number(1)
                .ok_or(ValueError::Malformed("ListValue without values"))?;
            let PValue::List(items) = &*values else {
                return Err(ValueError::Malformed("ListValue.values is not a list"));
            };
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let PValue::Message(v) = item else {
                    return Err(ValueError::Malformed("ListValue item is not a Value"));
                };
                write_json_like(JsonTextKind::Value, v, out, depth + 1)?;
            }
            out.push(b']');
        }
        JsonTextKind::Value => {
            let set = m.fields().next();
            match set {
                None | Some((_, PValue::EnumNumber(_))) => out.extend_from_slice(b"null"),
                Some((_, PValue::F64(f))) => text::double(out, *f),
                Some((_, PValue::String(s))) => text::string(out, s),
                Some((_, PValue::Bool(b))) => {
                    out.extend_from_slice(if *b { b"true" } else { b"false" })
                }
                Some((f, PValue::Message(inner))) => {
                    let kind = if f.number() == 5 {
                        JsonTextKind::Struct
                    } else {
                        JsonTextKind::ListValue
                    };
                    write_json_like(kind, inner, out, depth + 1)?;
                }
                Some((_, other)) => {
                    return Err(ValueError::UnexpectedMember(format!("{other:?}")));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
