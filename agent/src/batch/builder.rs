//! Arrow column builders fed straight from parsed JSON values.
//!
//! One builder tree per buffer schema. Values were admitted by the schema stage with the
//! same parsers used here ([`crate::record::values`]), so an append that fails is a bug,
//! reported as such rather than silently stored as null.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder, Float32Builder,
    Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, NullBufferBuilder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
    TimestampNanosecondBuilder,
};
use arrow_array::{ArrayRef, ListArray, MapArray, StructArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, FieldRef, Fields};
use iceberg::spec::{PrimitiveType, Type};

use crate::record::json::{Obj, Value};
use crate::record::values::{
    parse_date, parse_decimal, parse_hex, parse_time, parse_timestamp, parse_timestamp_nanos,
    parse_uuid, special_float,
};

/// Time zone of Iceberg's `timestamptz` columns in Arrow.
pub const UTC: &str = "+00:00";

/// A builder for one column (and its nested columns).
pub(super) enum Col {
    Bool(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder, u32, u32),
    Date(Date32Builder),
    Time(Time64MicrosecondBuilder),
    Timestamp(TimestampMicrosecondBuilder, bool),
    TimestampNs(TimestampNanosecondBuilder, bool),
    Utf8(StringBuilder),
    Binary(LargeBinaryBuilder),
    Uuid(FixedSizeBinaryBuilder),
    Fixed(FixedSizeBinaryBuilder),
    Struct(StructCol),
    List {
        field: FieldRef,
        child: Box<Col>,
        offsets: Vec<i32>,
        nulls: NullBufferBuilder,
    },
    Map {
        entries: FieldRef,
        key_field: FieldRef,
        value_field: FieldRef,
        keys: StringBuilder,
        values: Box<Col>,
        offsets: Vec<i32>,
        nulls: NullBufferBuilder,
    },
}

/// The builder of a struct: its children by name.
pub(super) struct StructCol {
    fields: Fields,
    children: Vec<Col>,
    /// Per child: the row it was last set in (to fill the others with nulls).
    set_in: Vec<usize>,
    nulls: NullBufferBuilder,
    rows: usize,
}

/// A value that the schema stage admitted but this builder cannot take (a bug).
#[derive(Debug)]
pub(super) struct Mismatch(pub String);

fn mismatch(what: &str, v: Value<'_>) -> Mismatch {
    Mismatch(format!("{} value for a {what} column", v.kind_name()))
}

impl Col {
    /// A builder for a column of Iceberg type `t`, whose Arrow type is `arrow`.
    pub(super) fn new(t: &Type, arrow: &DataType) -> Col {
        use PrimitiveType as P;
        match (t, arrow) {
            (Type::Primitive(p), _) => match p {
                P::Boolean => Col::Bool(BooleanBuilder::new()),
                P::Int => Col::Int32(Int32Builder::new()),
                P::Long => Col::Int64(Int64Builder::new()),
                P::Float => Col::Float32(Float32Builder::new()),
                P::Double => Col::Float64(Float64Builder::new()),
                P::Decimal { precision, scale } => Col::Decimal(
                    Decimal128Builder::new()
                        .with_precision_and_scale(*precision as u8, *scale as i8)
                        .expect("Iceberg decimals fit Arrow's"),
                    *precision,
                    *scale,
                ),
                P::Date => Col::Date(Date32Builder::new()),
                P::Time => Col::Time(Time64MicrosecondBuilder::new()),
                P::Timestamp => Col::Timestamp(TimestampMicrosecondBuilder::new(), false),
                P::Timestamptz => Col::Timestamp(TimestampMicrosecondBuilder::new(), true),
                P::TimestampNs => Col::TimestampNs(TimestampNanosecondBuilder::new(), false),
                P::TimestamptzNs => Col::TimestampNs(TimestampNanosecondBuilder::new(), true),
                P::String => Col::Utf8(StringBuilder::new()),
                P::Binary => Col::Binary(LargeBinaryBuilder::new()),
                P::Uuid => Col::Uuid(FixedSizeBinaryBuilder::new(16)),
                P::Fixed(_) => match arrow {
                    DataType::FixedSizeBinary(w) => Col::Fixed(FixedSizeBinaryBuilder::new(*w)),
                    _ => Col::Binary(LargeBinaryBuilder::new()),
                },
                // Nothing else; keep the compiler honest about new primitive types.
                #[allow(unreachable_patterns, reason = "future Iceberg primitive types")]
                _ => Col::Utf8(StringBuilder::new()),
            },
            (Type::Struct(st), DataType::Struct(fields)) => Col::Struct(StructCol::new(
                st.fields().iter().map(|f| &*f.field_type),
                fields.clone(),
            )),
            (Type::List(l), DataType::List(field)) => Col::List {
                field: field.clone(),
                child: Box::new(Col::new(&l.element_field.field_type, field.data_type())),
                offsets: vec![0],
                nulls: NullBufferBuilder::new(0),
            },
            (Type::Map(m), DataType::Map(entries, _)) => {
                let DataType::Struct(kv) = entries.data_type() else {
                    unreachable!("Arrow maps hold structs")
                };
                Col::Map {
                    entries: entries.clone(),
                    key_field: kv[0].clone(),
                    value_field: kv[1].clone(),
                    keys: StringBuilder::new(),
                    values: Box::new(Col::new(&m.value_field.field_type, kv[1].data_type())),
                    offsets: vec![0],
                    nulls: NullBufferBuilder::new(0),
                }
            }
            (t, a) => unreachable!("Iceberg type {t} converted to Arrow {a}"),
        }
    }

    pub(super) fn append_null(&mut self) {
        match self {
            Col::Bool(b) => b.append_null(),
            Col::Int32(b) => b.append_null(),
            Col::Int64(b) => b.append_null(),
            Col::Float32(b) => b.append_null(),
            Col::Float64(b) => b.append_null(),
            Col::Decimal(b, ..) => b.append_null(),
            Col::Date(b) => b.append_null(),
            Col::Time(b) => b.append_null(),
            Col::Timestamp(b, _) => b.append_null(),
            Col::TimestampNs(b, _) => b.append_null(),
            Col::Utf8(b) => b.append_null(),
            Col::Binary(b) => b.append_null(),
            Col::Uuid(b) | Col::Fixed(b) => b.append_null(),
            Col::Struct(s) => s.append_null(),
            Col::List { offsets, nulls, .. } | Col::Map { offsets, nulls, .. } => {
                offsets.push(*offsets.last().expect("offsets start at 0"));
                nulls.append_null();
            }
        }
    }

    pub(super) fn append(&mut self, v: Value<'_>) -> Result<(), Mismatch> {
        if v.is_null() {
            self.append_null();
            return Ok(());
        }
        match (self, v) {
            (Col::Bool(b), Value::Bool(x)) => b.append_value(x),
            (Col::Int32(b), Value::Number(n)) => b.append_value(
                n.as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| mismatch("int", v))?,
            ),
            (Col::Int64(b), Value::Number(n)) => {
                b.append_value(n.as_i64().ok_or_else(|| mismatch("long", v))?)
            }
            (Col::Float32(b), Value::Number(n)) => b.append_value(n.as_f64() as f32),
            (Col::Float64(b), Value::Number(n)) => b.append_value(n.as_f64()),
            (Col::Float32(b), Value::String(s)) => {
                b.append_value(special_float(s.raw()).ok_or_else(|| mismatch("float", v))? as f32)
            }
            (Col::Float64(b), Value::String(s)) => {
                b.append_value(special_float(s.raw()).ok_or_else(|| mismatch("double", v))?)
            }
            (Col::Decimal(b, p, s), Value::Number(n)) => b.append_value(
                parse_decimal(n.text(), *p, *s).ok_or_else(|| mismatch("decimal", v))?,
            ),
            (Col::Decimal(b, p, sc), Value::String(s)) => b.append_value(
                parse_decimal(&s.get(), *p, *sc).ok_or_else(|| mismatch("decimal", v))?,
            ),
            (Col::Date(b), Value::String(s)) => {
                b.append_value(parse_date(&s.get()).ok_or_else(|| mismatch("date", v))?)
            }
            (Col::Time(b), Value::String(s)) => {
                b.append_value(parse_time(&s.get()).ok_or_else(|| mismatch("time", v))?)
            }
            (Col::Timestamp(b, tz), Value::String(s)) => b.append_value(
                parse_timestamp(&s.get(), *tz).ok_or_else(|| mismatch("timestamp", v))?,
            ),
            (Col::TimestampNs(b, tz), Value::String(s)) => b.append_value(
                parse_timestamp_nanos(&s.get(), *tz).ok_or_else(|| mismatch("timestamp_ns", v))?,
            ),
            (Col::Utf8(b), Value::String(s)) => b.append_value(s.get()),
            (Col::Binary(b), Value::String(s)) => {
                b.append_value(parse_hex(s.raw()).ok_or_else(|| mismatch("binary", v))?)
            }
            (Col::Uuid(b), Value::String(s)) => b
                .append_value(parse_uuid(&s.get()).ok_or_else(|| mismatch("uuid", v))?)
                .map_err(|e| Mismatch(e.to_string()))?,
            (Col::Fixed(b), Value::String(s)) => b
                .append_value(parse_hex(s.raw()).ok_or_else(|| mismatch("fixed", v))?)
                .map_err(|e| Mismatch(e.to_string()))?,
            (Col::Struct(st), Value::Object(o)) => st.append(o)?,
            (
                Col::List {
                    child,
                    offsets,
                    nulls,
                    ..
                },
                Value::Array(items),
            ) => {
                let mut n = 0;
                for item in items.iter() {
                    child.append(item)?;
                    n += 1;
                }
                let last = *offsets.last().expect("offsets start at 0");
                offsets.push(last + n);
                nulls.append_non_null();
            }
            (
                Col::Map {
                    keys,
                    values,
                    offsets,
                    nulls,
                    ..
                },
                Value::Object(o),
            ) => {
                let mut n = 0;
                for (k, item) in o.iter() {
                    keys.append_value(k.get());
                    values.append(item)?;
                    n += 1;
                }
                let last = *offsets.last().expect("offsets start at 0");
                offsets.push(last + n);
                nulls.append_non_null();
            }
            (col, v) => return Err(mismatch(col.name(), v)),
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        match self {
            Col::Bool(_) => "boolean",
            Col::Int32(_) => "int",
            Col::Int64(_) => "long",
            Col::Float32(_) => "float",
            Col::Float64(_) => "double",
            Col::Decimal(..) => "decimal",
            Col::Date(_) => "date",
            Col::Time(_) => "time",
            Col::Timestamp(..) => "timestamp",
            Col::TimestampNs(..) => "timestamp_ns",
            Col::Utf8(_) => "string",
            Col::Binary(_) => "binary",
            Col::Uuid(_) => "uuid",
            Col::Fixed(_) => "fixed",
            Col::Struct(_) => "struct",
            Col::List { .. } => "list",
            Col::Map { .. } => "map",
        }
    }

    pub(super) fn finish(&mut self) -> ArrayRef {
        match self {
            Col::Bool(b) => Arc::new(b.finish()),
            Col::Int32(b) => Arc::new(b.finish()),
            Col::Int64(b) => Arc::new(b.finish()),
            Col::Float32(b) => Arc::new(b.finish()),
            Col::Float64(b) => Arc::new(b.finish()),
            Col::Decimal(b, ..) => Arc::new(b.finish()),
            Col::Date(b) => Arc::new(b.finish()),
            Col::Time(b) => Arc::new(b.finish()),
            Col::Timestamp(b, tz) => {
                let a = b.finish();
                if *tz {
                    Arc::new(a.with_timezone(UTC))
                } else {
                    Arc::new(a)
                }
            }
            Col::TimestampNs(b, tz) => {
                let a = b.finish();
                if *tz {
                    Arc::new(a.with_timezone(UTC))
                } else {
                    Arc::new(a)
                }
            }
            Col::Utf8(b) => Arc::new(b.finish()),
            Col::Binary(b) => Arc::new(b.finish()),
            Col::Uuid(b) | Col::Fixed(b) => Arc::new(b.finish()),
            Col::Struct(s) => Arc::new(s.finish()),
            Col::List {
                field,
                child,
                offsets,
                nulls,
            } => {
                let offsets = OffsetBuffer::new(std::mem::replace(offsets, vec![0]).into());
                Arc::new(
                    ListArray::try_new(field.clone(), offsets, child.finish(), nulls.finish())
                        .expect("list offsets and values agree"),
                )
            }
            Col::Map {
                entries,
                key_field,
                value_field,
                keys,
                values,
                offsets,
                nulls,
            } => {
                let offsets = OffsetBuffer::new(std::mem::replace(offsets, vec![0]).into());
                let kv = StructArray::new(
                    Fields::from(vec![key_field.clone(), value_field.clone()]),
                    vec![Arc::new(keys.finish()), values.finish()],
                    None,
                );
                Arc::new(
                    MapArray::try_new(entries.clone(), offsets, kv, nulls.finish(), false)
                        .expect("map offsets and entries agree"),
                )
            }
        }
    }
}

impl StructCol {
    pub(super) fn new<'t>(types: impl Iterator<Item = &'t Type>, fields: Fields) -> StructCol {
        let children: Vec<Col> = types
            .zip(fields.iter())
            .map(|(t, f)| Col::new(t, f.data_type()))
            .collect();
        StructCol {
            set_in: vec![usize::MAX; children.len()],
            fields,
            children,
            nulls: NullBufferBuilder::new(0),
            rows: 0,
        }
    }

    /// Index of the child named `name`, trying `hint` (the position after the previous
    /// match) first: records usually list fields in the same order.
    fn find(&self, name: &str, hint: usize) -> Option<usize> {
        if self.fields.get(hint).is_some_and(|f| f.name() == name) {
            return Some(hint);
        }
        self.fields.iter().position(|f| f.name() == name)
    }

    /// Appends an object: known fields to their children, nulls to the others; fields
    /// without a column (the `_kafka_*` names at the top level) are skipped.
    pub(super) fn append(&mut self, o: Obj<'_>) -> Result<(), Mismatch> {
        let row = self.rows;
        let mut hint = 0;
        for (key, value) in o.iter() {
            let name = key.get();
            let Some(i) = self.find(&name, hint) else {
                continue;
            };
            self.children[i].append(value)?;
            self.set_in[i] = row;
            hint = i + 1;
        }
        for (i, child) in self.children.iter_mut().enumerate() {
            if self.set_in[i] != row {
                child.append_null();
            }
        }
        self.nulls.append_non_null();
        self.rows += 1;
        Ok(())
    }

    pub(super) fn append_null(&mut self) {
        for child in &mut self.children {
            child.append_null();
        }
        self.nulls.append_null();
        self.rows += 1;
    }

    /// The children's arrays (for the top level, which is not a struct column).
    pub(super) fn finish_columns(&mut self) -> Vec<ArrayRef> {
        self.nulls = NullBufferBuilder::new(0);
        self.set_in.fill(usize::MAX);
        self.rows = 0;
        self.children.iter_mut().map(Col::finish).collect()
    }

    fn finish(&mut self) -> StructArray {
        let nulls = self.nulls.finish();
        let rows = self.rows;
        self.set_in.fill(usize::MAX);
        self.rows = 0;
        let columns: Vec<ArrayRef> = self.children.iter_mut().map(Col::finish).collect();
        if self.fields.is_empty() {
            return StructArray::new_empty_fields(rows, nulls);
        }
        StructArray::new(self.fields.clone(), columns, nulls)
    }
}
