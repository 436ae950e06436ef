//! Protobuf message descriptors -> Iceberg types (the table in `docs/types.md`), and the
//! plan that writes a decoded message as JSON text of exactly those types.
//!
//! The plan is built once per message type; decoding walks it, so a record costs no
//! name lookups: only the decoded message, the output text and a sort of map keys.
//! Field ids in the Iceberg types are placeholders (0); the schema tracker or the table
//! assigns real ones, by name, so they stay stable as messages evolve.

use std::sync::Arc;

use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};

/// How a message type is written, member by member in declaration order.
#[derive(Debug)]
pub(crate) struct MessagePlan {
    pub(crate) members: Vec<Member>,
}

/// One column of a message.
#[derive(Debug)]
pub(crate) enum Member {
    /// An ordinary field (proto3 `optional` fields included).
    Field(FieldPlan),
    /// A oneof (not the synthetic one of a proto3 `optional`): a struct named after the
    /// oneof with one optional field per member; only the member that is set has a value.
    Oneof {
        /// The oneof's name, as a JSON string with the `:` after it.
        key: String,
        /// Its name.
        name: String,
        /// Its members.
        fields: Vec<FieldPlan>,
    },
}

/// One field.
#[derive(Debug)]
pub(crate) struct FieldPlan {
    pub(crate) field: FieldDescriptor,
    /// The field name as a JSON string with the `:` after it.
    pub(crate) key: String,
    /// Explicit presence (message, oneof member, proto3 `optional`, proto2 `optional`):
    /// absent is null. Otherwise an absent field is its default value.
    pub(crate) presence: bool,
    pub(crate) cardinality: Cardinality,
    pub(crate) value: ValuePlan,
}

/// Singular, repeated or map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cardinality {
    Single,
    List,
    Map,
}

/// How one value is written.
#[derive(Debug)]
pub(crate) enum ValuePlan {
    Double,
    Float,
    /// int32, sint32, sfixed32: a JSON number (`int`).
    Int,
    /// int64, sint64, sfixed64, uint32, fixed32: a JSON number (`long`).
    Long,
    /// uint64, fixed64: an exact decimal string (`decimal(20, 0)`).
    Unsigned64,
    Bool,
    String,
    Bytes,
    /// The value's name (its number as text when the schema does not know it).
    Enum(EnumDescriptor),
    Message(Box<MessagePlan>),
    /// `google.protobuf.Timestamp`: ISO-8601 UTC, microseconds.
    Timestamp,
    /// `google.protobuf.Duration`: microseconds as a number.
    Duration,
    /// `google.protobuf.*Value` wrappers: the wrapped value (field 1).
    Wrapper(Box<ValuePlan>),
    /// `google.protobuf.Struct`, `Value`, `ListValue`: their JSON text, as a string.
    JsonText(JsonTextKind),
    /// A message with no fields (e.g. `google.protobuf.Empty`): no column.
    Nothing,
}

/// Why a Protobuf message type cannot describe table columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoMappingError {
    /// A message contains itself (directly or through other messages); Iceberg has no
    /// recursive types.
    #[error("recursive Protobuf message `{0}` cannot become an Iceberg column")]
    Recursive(String),
    /// A map field whose descriptor has no entry message.
    #[error("map field {0} has no entry message")]
    MapWithoutEntry(String),
    /// A well-known wrapper type (`google.protobuf.Int64Value`, ...) without its value.
    #[error("{0} has no field 1")]
    WrapperWithoutValue(String),
}

/// Which of the JSON-like well-known types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonTextKind {
    Struct,
    Value,
    ListValue,
}

impl MessagePlan {
    /// The plan of a message type. A message that contains itself (directly or through
    /// other messages) has no Iceberg equivalent: the error names it.
    pub(crate) fn new(message: &MessageDescriptor) -> Result<MessagePlan, ProtoMappingError> {
        let mut stack = vec![message.full_name().to_string()];
        plan_message(message, &mut stack)
    }

    /// The columns this message declares (placeholder ids 0).
    pub(crate) fn columns(&self) -> StructType {
        let mut fields = Vec::new();
        for member in &self.members {
            match member {
                Member::Field(f) => {
                    if let Some(t) = f.iceberg_type() {
                        fields.push(Arc::new(NestedField::optional(0, f.field.name(), t)));
                    }
                }
                Member::Oneof {
                    name,
                    fields: choices,
                    ..
                } => {
                    let inner: Vec<_> = choices
                        .iter()
                        .filter_map(|f| {
                            f.iceberg_type()
                                .map(|t| Arc::new(NestedField::optional(0, f.field.name(), t)))
                        })
                        .collect();
                    if !inner.is_empty() {
                        fields.push(Arc::new(NestedField::optional(
                            0,
                            name.clone(),
                            Type::Struct(StructType::new(inner)),
                        )));
                    }
                }
            }
        }
        StructType::new(fields)
    }
}

impl FieldPlan {
    /// The column type; `None` when the field has none (an empty message).
    pub(crate) fn iceberg_type(&self) -> Option<Type> {
        let element = self.value.iceberg_type()?;
        Some(match self.cardinality {
            Cardinality::Single => element,
            Cardinality::List => Type::List(ListType::new(Arc::new(NestedField::list_element(
                0, element, false,
            )))),
            Cardinality::Map => Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(
                    0,
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::map_value_element(0, element, false)),
            )),
        })
    }
}

impl ValuePlan {
    /// The Iceberg type of one value.
    pub(crate) fn iceberg_type(&self) -> Option<Type> {
        use PrimitiveType as P;
        let p = |t: P| Some(Type::Primitive(t));
        match self {
            ValuePlan::Double => p(P::Double),
            ValuePlan::Float => p(P::Float),
            ValuePlan::Int => p(P::Int),
            ValuePlan::Long => p(P::Long),
            ValuePlan::Unsigned64 => p(P::Decimal {
                precision: 20,
                scale: 0,
            }),
            ValuePlan::Bool => p(P::Boolean),
            ValuePlan::String | ValuePlan::Enum(_) | ValuePlan::JsonText(_) => p(P::String),
            ValuePlan::Bytes => p(P::Binary),
            ValuePlan::Timestamp => p(P::Timestamptz),
            ValuePlan::Duration => p(P::Long),
            ValuePlan::Wrapper(inner) => inner.iceberg_type(),
            ValuePlan::Message(m) => {
                let s = m.columns();
                (!s.fields().is_empty()).then_some(Type::Struct(s))
            }
            ValuePlan::Nothing => None,
        }
    }
}

fn json_key(name: &str) -> String {
    let mut key = serde_json::to_string(name).expect("a string serializes");
    key.push(':');
    key
}

fn plan_message(
    message: &MessageDescriptor,
    stack: &mut Vec<String>,
) -> Result<MessagePlan, ProtoMappingError> {
    let mut members = Vec::new();
    for field in message.fields() {
        match field.containing_oneof() {
            Some(oneof) if !oneof.is_synthetic() => {
                let first = oneof.fields().next().map(|f| f.number());
                if first == Some(field.number()) {
                    let fields = oneof
                        .fields()
                        .map(|f| plan_field(&f, stack))
                        .collect::<Result<Vec<_>, _>>()?;
                    members.push(Member::Oneof {
                        key: json_key(oneof.name()),
                        name: oneof.name().to_string(),
                        fields,
                    });
                }
            }
            _ => members.push(Member::Field(plan_field(&field, stack)?)),
        }
    }
    Ok(MessagePlan { members })
}

fn plan_field(
    field: &FieldDescriptor,
    stack: &mut Vec<String>,
) -> Result<FieldPlan, ProtoMappingError> {
    let (cardinality, kind) = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(ProtoMappingError::MapWithoutEntry(
                field.full_name().to_string(),
            ));
        };
        (Cardinality::Map, entry.map_entry_value_field().kind())
    } else if field.is_list() {
        (Cardinality::List, field.kind())
    } else {
        (Cardinality::Single, field.kind())
    };
    Ok(FieldPlan {
        key: json_key(field.name()),
        presence: cardinality == Cardinality::Single && field.supports_presence(),
        cardinality,
        value: plan_value(&kind, stack)?,
        field: field.clone(),
    })
}

fn plan_value(kind: &Kind, stack: &mut Vec<String>) -> Result<ValuePlan, ProtoMappingError> {
    Ok(match kind {
        Kind::Double => ValuePlan::Double,
        Kind::Float => ValuePlan::Float,
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => ValuePlan::Int,
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint32 | Kind::Fixed32 => {
            ValuePlan::Long
        }
        Kind::Uint64 | Kind::Fixed64 => ValuePlan::Unsigned64,
        Kind::Bool => ValuePlan::Bool,
        Kind::String => ValuePlan::String,
        Kind::Bytes => ValuePlan::Bytes,
        Kind::Enum(e) => ValuePlan::Enum(e.clone()),
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Timestamp" => ValuePlan::Timestamp,
            "google.protobuf.Duration" => ValuePlan::Duration,
            "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue" => {
                let value = m
                    .get_field(1)
                    .ok_or_else(|| ProtoMappingError::WrapperWithoutValue(m.full_name().into()))?;
                ValuePlan::Wrapper(Box::new(plan_value(&value.kind(), stack)?))
            }
            "google.protobuf.Struct" => ValuePlan::JsonText(JsonTextKind::Struct),
            "google.protobuf.Value" => ValuePlan::JsonText(JsonTextKind::Value),
            "google.protobuf.ListValue" => ValuePlan::JsonText(JsonTextKind::ListValue),
            name => {
                if stack.iter().any(|n| n == name) {
                    return Err(ProtoMappingError::Recursive(name.to_string()));
                }
                stack.push(name.to_string());
                let plan = plan_message(m, stack);
                stack.pop();
                let plan = plan?;
                if plan.columns().fields().is_empty() {
                    ValuePlan::Nothing
                } else {
                    ValuePlan::Message(Box::new(plan))
                }
            }
        },
    })
}
