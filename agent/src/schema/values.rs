//! Which JSON values a column of a given Iceberg type can hold, and the `coerce` rewrite.
//!
//! The checks match what the Arrow JSON reader of the batch stage accepts for each type,
//! so a record that passes never fails later in the batch stage.

use chrono::{NaiveDate, NaiveTime};
use iceberg::spec::{PrimitiveType, Type};
use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::{Kind, Node, timestamp_shape};

/// Whether `v` can be stored in a column of type `t` (null always can).
pub fn type_accepts(t: &Type, v: &Value) -> bool {
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
            (P::Float, Value::Number(n)) => n.as_f64().is_some_and(|f| f.abs() <= f32::MAX.into()),
            (P::Double, Value::Number(_)) => true,
            (P::Float | P::Double, Value::String(s)) => {
                matches!(s.as_str(), "NaN" | "inf" | "-inf")
            }
            (P::Decimal { precision, scale }, Value::Number(n)) => {
                decimal_fits(&n.to_string(), *precision, *scale)
            }
            (P::Decimal { precision, scale }, Value::String(s)) => {
                decimal_fits(s, *precision, *scale)
            }
            (P::String, Value::String(_)) => true,
            (P::Date, Value::String(s)) => NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok(),
            (P::Time, Value::String(s)) => NaiveTime::parse_from_str(s, "%H:%M:%S%.f").is_ok(),
            (P::Timestamp, Value::String(s)) => timestamp_shape(s) == Some(false),
            (P::Timestamptz, Value::String(s)) => timestamp_shape(s) == Some(true),
            (P::Uuid, Value::String(s)) => s.len() == 36 && uuid::Uuid::try_parse(s).is_ok(),
            (P::Binary, Value::String(s)) => is_hex(s),
            (P::Fixed(n), Value::String(s)) => is_hex(s) && s.len() as u64 == 2 * n,
            _ => false,
        },
        (Type::Struct(st), Value::Object(m)) => m.iter().all(|(k, v)| {
            st.field_by_name(k)
                .is_none_or(|f| type_accepts(&f.field_type, v))
        }),
        (Type::List(l), Value::Array(items)) => items
            .iter()
            .all(|i| !i.is_null() && type_accepts(&l.element_field.field_type, i)),
        (Type::Map(m), Value::Object(entries)) => entries
            .values()
            .all(|v| type_accepts(&m.value_field.field_type, v)),
        _ => false,
    }
}

fn is_hex(s: &str) -> bool {
    s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A plain decimal (`-12.50`, no exponent) with at most `precision - scale` integer
/// digits and at most `scale` fraction digits.
fn decimal_fits(s: &str, precision: u32, scale: u32) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |x: &str| x.bytes().all(|b| b.is_ascii_digit());
    let int = int.trim_start_matches('0');
    !digits.is_empty()
        && all_digits(int)
        && all_digits(frac)
        && frac.len() as u32 <= scale
        && int.len() as u32 <= precision - scale
}

/// Rewrites values that do not fit a string column into their JSON text.
pub(super) fn coerce_object(
    fields: &IndexMap<String, Node>,
    record: &mut Map<String, Value>,
) -> bool {
    let mut changed = false;
    for (name, value) in record.iter_mut() {
        if let Some(node) = fields.get(name) {
            changed |= coerce_value(node, value);
        }
    }
    changed
}

fn coerce_value(node: &Node, v: &mut Value) -> bool {
    match (&node.kind, &mut *v) {
        (_, Value::Null) => false,
        (Some(Kind::String), Value::String(_)) => false,
        (Some(Kind::String), other) => {
            *v = Value::String(other.to_string());
            true
        }
        (Some(Kind::Other(Type::Primitive(PrimitiveType::String))), other)
            if !other.is_string() =>
        {
            *v = Value::String(other.to_string());
            true
        }
        (Some(Kind::Struct(fields)), Value::Object(m)) => coerce_object(fields, m),
        (Some(Kind::List(element)), Value::Array(items)) => {
            let mut changed = false;
            for item in items {
                changed |= coerce_value(element, item);
            }
            changed
        }
        _ => false,
    }
}
