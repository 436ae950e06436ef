//! Which JSON values a column of a given Iceberg type can hold, and the `coerce` rewrite.
//!
//! The checks use the parsers of [`crate::record::values`], the same the batch stage
//! encodes with, so a record that passes never fails later in the batch stage.

use iceberg::spec::{PrimitiveType, Type};
use indexmap::IndexMap;

use super::{Kind, Node};
use crate::record::json::{JsonObject, JsonWriter, Obj, Value};
use crate::record::values::{
    parse_date, parse_decimal, parse_hex, parse_time, parse_timestamp, parse_uuid, special_float,
};

/// Whether `v` can be stored in a column of type `t` (null always can).
pub fn accepts(t: &Type, v: Value<'_>) -> bool {
    use PrimitiveType as P;
    if v.is_null() {
        return true;
    }
    match (t, v) {
        (Type::Primitive(p), v) => match (p, v) {
            (P::Boolean, Value::Bool(_)) => true,
            (P::Int, Value::Number(n)) => n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
            (P::Long, Value::Number(n)) => n.is_i64(),
            // A float column holds what an f32 can: beyond that it would read as infinity.
            (P::Float, Value::Number(n)) => n.as_f64().abs() <= f64::from(f32::MAX),
            (P::Double, Value::Number(n)) => n.as_f64().is_finite(),
            (P::Float | P::Double, Value::String(s)) => special_float(s.raw()).is_some(),
            (P::Decimal { precision, scale }, Value::Number(n)) => {
                parse_decimal(n.text(), *precision, *scale).is_some()
            }
            (P::Decimal { precision, scale }, Value::String(s)) => {
                parse_decimal(&s.get(), *precision, *scale).is_some()
            }
            (P::String, Value::String(_)) => true,
            (P::Date, Value::String(s)) => parse_date(&s.get()).is_some(),
            (P::Time, Value::String(s)) => parse_time(&s.get()).is_some(),
            (P::Timestamp | P::TimestampNs, Value::String(s)) => {
                parse_timestamp(&s.get(), false).is_some()
            }
            (P::Timestamptz | P::TimestamptzNs, Value::String(s)) => {
                parse_timestamp(&s.get(), true).is_some()
            }
            (P::Uuid, Value::String(s)) => parse_uuid(&s.get()).is_some(),
            (P::Binary, Value::String(s)) => parse_hex(s.raw()).is_some(),
            (P::Fixed(n), Value::String(s)) => {
                s.raw().len() as u64 == 2 * n && parse_hex(s.raw()).is_some()
            }
            _ => false,
        },
        (Type::Struct(st), Value::Object(m)) => m.iter().all(|(k, v)| {
            st.field_by_name(&k.get())
                .is_none_or(|f| accepts(&f.field_type, v))
        }),
        (Type::List(l), Value::Array(items)) => items
            .iter()
            .all(|i| !i.is_null() && accepts(&l.element_field.field_type, i)),
        (Type::Map(m), Value::Object(entries)) => entries
            .iter()
            .all(|(_, v)| accepts(&m.value_field.field_type, v)),
        _ => false,
    }
}

/// [`accepts`] for a `serde_json` value (tests and tools).
pub fn type_accepts(t: &Type, v: &serde_json::Value) -> bool {
    let mut map = serde_json::Map::new();
    map.insert("v".into(), v.clone());
    let o = JsonObject::from_map(&map);
    let root = o.view().root();
    accepts(t, root.get("v").unwrap_or(Value::Null))
}

/// Rewrites values that do not fit a string column into their JSON text; `None` when
/// nothing needed rewriting.
pub(super) fn coerce_object(
    fields: &IndexMap<String, Node>,
    record: Obj<'_>,
) -> Option<JsonObject> {
    if !object_needs(fields, record) {
        return None;
    }
    let mut w = JsonWriter::with_capacity(record.raw().len() + 16);
    write_object(&mut w, fields, record);
    Some(w.finish())
}

fn is_string_column(node: &Node) -> bool {
    matches!(
        node.kind,
        Some(Kind::String) | Some(Kind::Other(Type::Primitive(PrimitiveType::String)))
    )
}

fn object_needs(fields: &IndexMap<String, Node>, record: Obj<'_>) -> bool {
    record.iter().any(|(k, v)| {
        fields
            .get(k.get().as_ref())
            .is_some_and(|node| value_needs(node, v))
    })
}

fn value_needs(node: &Node, v: Value<'_>) -> bool {
    match (&node.kind, v) {
        (_, Value::Null) | (_, Value::String(_)) => false,
        _ if is_string_column(node) => true,
        (Some(Kind::Struct(fields)), Value::Object(m)) => object_needs(fields, m),
        (Some(Kind::List(element)), Value::Array(items)) => {
            items.iter().any(|i| value_needs(element, i))
        }
        _ => false,
    }
}

fn write_object(w: &mut JsonWriter, fields: &IndexMap<String, Node>, record: Obj<'_>) {
    w.begin_object();
    for (k, v) in record.iter() {
        let name = k.get();
        w.key(&name);
        match fields.get(name.as_ref()) {
            Some(node) => write_value(w, node, v),
            None => w.value(v),
        }
    }
    w.end_object();
}

fn write_value(w: &mut JsonWriter, node: &Node, v: Value<'_>) {
    match (&node.kind, v) {
        (_, Value::Null) | (_, Value::String(_)) => w.value(v),
        // The compact JSON text of the value, as a string.
        _ if is_string_column(node) => {
            let text = serde_json::to_string(&v.to_serde()).expect("JSON values serialize");
            w.string(&text);
        }
        (Some(Kind::Struct(fields)), Value::Object(m)) => write_object(w, fields, m),
        (Some(Kind::List(element)), Value::Array(items)) => {
            w.begin_array();
            for item in items.iter() {
                write_value(w, element, item);
            }
            w.end_array();
        }
        _ => w.value(v),
    }
}
