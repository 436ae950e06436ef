//! Avro values -> the JSON record representation plugins and the batch stage receive.
//!
//! The mapping (also in `docs/types.md` and the SDK docs) is chosen so that the JSON
//! text is exact and the Arrow JSON reader turns it into the column type the Avro
//! schema declares: decimals as exact decimal strings, dates/times/timestamps as
//! ISO-8601 strings, bytes and fixed as lowercase hex, uuid in its canonical form,
//! enums as their symbol, unions with null as the plain value, other unions as
//! `{"<branch>": value}`.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use apache_avro::Schema as AvroSchema;
use apache_avro::schema::{Name, ResolvedSchema};
use apache_avro::types::Value as Avro;
use chrono::{DateTime, NaiveDate, NaiveTime, TimeDelta};
use iceberg::spec::{NestedField, StructType};
use indexmap::IndexMap;
use serde_json::{Map, Number, Value};

use super::DecodeError;
use crate::record::json::{JsonObject, JsonWriter};

pub mod types;

use self::types::{AvroMappingError, record_columns_with, union_branch_name};

/// The Confluent wire format's first byte.
pub const MAGIC_BYTE: u8 = 0;

/// A parsed writer schema and the columns it declares.
#[derive(Debug)]
pub struct WriterSchema {
    /// Registry id (`None` for a schema from a file).
    pub id: Option<u32>,
    /// The parsed schema.
    pub schema: AvroSchema,
    /// Payload columns with their exact Iceberg types (field ids are placeholders).
    pub columns: Arc<StructType>,
    /// Named types by full name, resolved once (unions and arrays refer to them).
    names: HashMap<Name, AvroSchema>,
    /// Schemas of registry references, which define named types the schema uses.
    schemata: Vec<AvroSchema>,
}

impl WriterSchema {
    /// Parses an Avro schema (JSON text) and maps it to columns. A schema that is not a
    /// record parses (keys may be primitives) but declares no columns.
    pub fn parse(id: Option<u32>, text: &str) -> Result<WriterSchema, DecodeError> {
        WriterSchema::parse_with_references(id, text, &[])
    }

    /// [`WriterSchema::parse`] for a schema that uses named types defined in other
    /// schemas (registry references), given as their JSON texts.
    pub fn parse_with_references(
        id: Option<u32>,
        text: &str,
        references: &[&str],
    ) -> Result<WriterSchema, DecodeError> {
        let bad = |e: &dyn std::fmt::Display| DecodeError::BadSchema {
            id,
            reason: e.to_string(),
        };
        // apache-avro 0.21 panics on some invalid schemas (it unwraps an invalid record
        // name such as "a-b"): a schema from a registry must not take the pipeline down,
        // so a panic is a bad schema like any other.
        let parsed = std::panic::catch_unwind(|| {
            if references.is_empty() {
                AvroSchema::parse_str(text).map(|s| (s, Vec::new()))
            } else {
                AvroSchema::parse_str_with_list(text, references)
            }
        })
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown");
            DecodeError::BadSchema {
                id,
                reason: format!("the Avro library cannot parse it ({what})"),
            }
        })?;
        let (schema, schemata) = parsed.map_err(|e| bad(&e))?;
        let columns = match record_columns_with(&schema, &schemata) {
            Ok(c) => c,
            Err(AvroMappingError::NotARecord(_)) => IndexMap::new(),
            Err(e) => return Err(bad(&e)),
        };
        let names = ResolvedSchema::try_from(
            schemata
                .iter()
                .chain(std::iter::once(&schema))
                .collect::<Vec<_>>(),
        )
        .map_err(|e| bad(&e))?
        .get_names()
        .iter()
        .map(|(name, s)| (name.clone(), (*s).clone()))
        .collect();
        Ok(WriterSchema {
            id,
            names,
            schema,
            schemata,
            columns: Arc::new(StructType::new(
                columns
                    .into_iter()
                    .map(|(name, t)| Arc::new(NestedField::optional(0, name, t)))
                    .collect(),
            )),
        })
    }

    /// Decodes one Avro record (no header) into a parsed JSON object (text and tape
    /// written together, nothing parsed back).
    pub fn decode(&self, bytes: &[u8]) -> Result<JsonObject, DecodeError> {
        let value = self.read(bytes)?;
        let conv = Converter { names: &self.names };
        if !matches!(self.schema, AvroSchema::Record(_)) {
            let kind = super::json_kind(&conv.to_json(&self.schema, value)?);
            return Err(DecodeError::NotAnObject(kind));
        }
        let mut w = JsonWriter::with_capacity(bytes.len() * 2 + 16);
        conv.write(&mut w, &self.schema, value)?;
        Ok(w.finish())
    }

    /// Reads one datum, refusing truncated input and trailing bytes.
    fn read(&self, bytes: &[u8]) -> Result<Avro, DecodeError> {
        let mut reader = EofGuard {
            rest: bytes,
            hit_eof: false,
        };
        let value = if self.schemata.is_empty() {
            apache_avro::from_avro_datum(&self.schema, &mut reader, None)
        } else {
            // Named types from references: the names come from every schema given.
            apache_avro::from_avro_datum_schemata(
                &self.schema,
                self.schemata
                    .iter()
                    .chain(std::iter::once(&self.schema))
                    .collect(),
                &mut reader,
                None,
            )
        }
        .map_err(|e| DecodeError::NotAvro(e.to_string()))?;
        if reader.hit_eof {
            // apache-avro reads a string, boolean or union cut off by the end as null.
            return Err(DecodeError::NotAvro(format!(
                "{} bytes end before the record does",
                bytes.len()
            )));
        }
        if !reader.rest.is_empty() {
            return Err(DecodeError::NotAvro(format!(
                "{} trailing bytes after the record",
                reader.rest.len()
            )));
        }
        Ok(value)
    }

    /// Decodes one Avro datum (no header) of any type into its JSON representation
    /// (keys, which are often primitives).
    pub fn decode_any(&self, bytes: &[u8]) -> Result<Value, DecodeError> {
        let value = self.read(bytes)?;
        let conv = Converter { names: &self.names };
        conv.to_json(&self.schema, value)
    }
}

/// A reader that remembers whether anything tried to read past the end (the decoder
/// only makes exact reads, so a valid datum never does).
struct EofGuard<'a> {
    rest: &'a [u8],
    hit_eof: bool,
}

impl Read for EofGuard<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.len() > self.rest.len() {
            self.hit_eof = true;
        }
        let n = buf.len().min(self.rest.len());
        buf[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Ok(n)
    }
}

/// Splits a Confluent-framed message into its schema id and Avro body.
pub fn split_confluent(bytes: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    match bytes {
        [MAGIC_BYTE, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        [first, ..] if *first != MAGIC_BYTE => Err(DecodeError::NotAvro(format!(
            "first byte is {first:#04x}, not the Confluent magic byte 0"
        ))),
        _ => Err(DecodeError::NotAvro(format!(
            "{} bytes, shorter than the 5-byte Confluent header",
            bytes.len()
        ))),
    }
}

struct Converter<'a> {
    names: &'a HashMap<Name, AvroSchema>,
}

fn bad(what: &str) -> DecodeError {
    DecodeError::NotAvro(format!("value does not match its schema ({what})"))
}

impl Converter<'_> {
    fn resolve<'s>(&'s self, s: &'s AvroSchema) -> &'s AvroSchema {
        match s {
            AvroSchema::Ref { name } => self.names.get(name).unwrap_or(s),
            other => other,
        }
    }

    fn to_json(&self, schema: &AvroSchema, v: Avro) -> Result<Value, DecodeError> {
        let schema = self.resolve(schema);
        Ok(match (schema, v) {
            (_, Avro::Null) => Value::Null,
            (_, Avro::Boolean(b)) => Value::Bool(b),
            (_, Avro::Int(i)) => Value::from(i),
            (_, Avro::Long(i) | Avro::TimestampNanos(i) | Avro::LocalTimestampNanos(i)) => {
                Value::from(i)
            }
            (_, Avro::Float(f)) => float(f as f64),
            (_, Avro::Double(f)) => float(f),
            (_, Avro::String(s)) => Value::String(s),
            (_, Avro::Enum(_, symbol)) => Value::String(symbol),
            (_, Avro::Bytes(b) | Avro::Fixed(_, b)) => Value::String(hex(&b)),
            (_, Avro::Uuid(u)) => Value::String(u.hyphenated().to_string()),
            (_, Avro::Date(d)) => Value::String(date(d)?),
            (_, Avro::TimeMillis(ms)) => Value::String(time_micros(i64::from(ms) * 1000)?),
            (_, Avro::TimeMicros(us)) => Value::String(time_micros(us)?),
            (_, Avro::TimestampMillis(ms)) => Value::String(timestamp_micros(millis(ms)?, true)?),
            (_, Avro::TimestampMicros(us)) => Value::String(timestamp_micros(us, true)?),
            (_, Avro::LocalTimestampMillis(ms)) => {
                Value::String(timestamp_micros(millis(ms)?, false)?)
            }
            (_, Avro::LocalTimestampMicros(us)) => Value::String(timestamp_micros(us, false)?),
            (_, Avro::Duration(d)) => Value::String(hex(&<[u8; 12]>::from(d))),
            (_, Avro::BigDecimal(d)) => Value::String(d.to_string()),
            (AvroSchema::Decimal(d), Avro::Decimal(dec)) => {
                let bytes = Vec::<u8>::try_from(&dec).map_err(|e| bad(&e.to_string()))?;
                // Also for precision > MAX_DECIMAL_PRECISION, whose column is a string.
                Value::String(decimal_text(&bytes, d.scale))
            }
            (_, Avro::Decimal(_)) => return Err(bad("decimal without decimal schema")),
            (AvroSchema::Array(a), Avro::Array(items)) => Value::Array(
                items
                    .into_iter()
                    .map(|i| self.to_json(&a.items, i))
                    .collect::<Result<_, _>>()?,
            ),
            (AvroSchema::Map(m), Avro::Map(entries)) => {
                // Sorted keys: the JSON text of a record does not depend on hash order.
                let mut entries: Vec<_> = entries.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let mut out = Map::with_capacity(entries.len());
                for (k, v) in entries {
                    out.insert(k, self.to_json(&m.types, v)?);
                }
                Value::Object(out)
            }
            (AvroSchema::Record(r), Avro::Record(fields)) => {
                let mut out = Map::with_capacity(fields.len());
                for ((name, v), f) in fields.into_iter().zip(&r.fields) {
                    out.insert(name, self.to_json(&f.schema, v)?);
                }
                Value::Object(out)
            }
            (AvroSchema::Union(u), Avro::Union(index, inner)) => {
                let (branch, tagged) = union_branch(u, index)?;
                let value = self.to_json(branch, *inner)?;
                if !tagged || value.is_null() {
                    value
                } else {
                    let mut wrapped = Map::new();
                    wrapped.insert(union_branch_name(self.resolve(branch)), value);
                    Value::Object(wrapped)
                }
            }
            (_, other) => return Err(bad(&format!("{other:?}"))),
        })
    }
}

/// Branch `index` of union `u`, and whether its value is tagged with the branch's name
/// (the union has several non-null branches).
fn union_branch(
    u: &apache_avro::schema::UnionSchema,
    index: u32,
) -> Result<(&AvroSchema, bool), DecodeError> {
    let branch = u
        .variants()
        .get(index as usize)
        .ok_or_else(|| bad("union branch out of range"))?;
    let non_null = u
        .variants()
        .iter()
        .filter(|s| !matches!(s, AvroSchema::Null))
        .count();
    Ok((branch, non_null > 1))
}

impl Converter<'_> {
    /// Writes `v` (of `schema`) as JSON, with the same mapping as [`Converter::to_json`].
    fn write(&self, w: &mut JsonWriter, schema: &AvroSchema, v: Avro) -> Result<(), DecodeError> {
        let schema = self.resolve(schema);
        match (schema, v) {
            (_, Avro::Null) => w.null(),
            (_, Avro::Boolean(b)) => w.bool(b),
            (_, Avro::Int(i)) => w.i64(i64::from(i)),
            (_, Avro::Long(i) | Avro::TimestampNanos(i) | Avro::LocalTimestampNanos(i)) => w.i64(i),
            (_, Avro::Float(f)) => w.f64(f64::from(f)),
            (_, Avro::Double(f)) => w.f64(f),
            (_, Avro::String(s)) => w.string(&s),
            (_, Avro::Enum(_, symbol)) => w.string(&symbol),
            (_, Avro::Bytes(b) | Avro::Fixed(_, b)) => w.string(&hex(&b)),
            (_, Avro::Uuid(u)) => w.string(&u.hyphenated().to_string()),
            (_, Avro::Date(d)) => w.string(&date(d)?),
            (_, Avro::TimeMillis(ms)) => w.string(&time_micros(i64::from(ms) * 1000)?),
            (_, Avro::TimeMicros(us)) => w.string(&time_micros(us)?),
            (_, Avro::TimestampMillis(ms)) => w.string(&timestamp_micros(millis(ms)?, true)?),
            (_, Avro::TimestampMicros(us)) => w.string(&timestamp_micros(us, true)?),
            (_, Avro::LocalTimestampMillis(ms)) => w.string(&timestamp_micros(millis(ms)?, false)?),
            (_, Avro::LocalTimestampMicros(us)) => w.string(&timestamp_micros(us, false)?),
            (_, Avro::Duration(d)) => w.string(&hex(&<[u8; 12]>::from(d))),
            (_, Avro::BigDecimal(d)) => w.string(&d.to_string()),
            (AvroSchema::Decimal(d), Avro::Decimal(dec)) => {
                let bytes = Vec::<u8>::try_from(&dec).map_err(|e| bad(&e.to_string()))?;
                w.string(&decimal_text(&bytes, d.scale));
            }
            (_, Avro::Decimal(_)) => return Err(bad("decimal without decimal schema")),
            (AvroSchema::Array(a), Avro::Array(items)) => {
                w.begin_array();
                for i in items {
                    self.write(w, &a.items, i)?;
                }
                w.end_array();
            }
            (AvroSchema::Map(m), Avro::Map(entries)) => {
                // Sorted keys: the JSON text of a record does not depend on hash order.
                let mut entries: Vec<_> = entries.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                w.begin_object();
                for (k, v) in entries {
                    w.key(&k);
                    self.write(w, &m.types, v)?;
                }
                w.end_object();
            }
            (AvroSchema::Record(r), Avro::Record(fields)) => {
                w.begin_object();
                for ((name, v), f) in fields.into_iter().zip(&r.fields) {
                    w.key(&name);
                    self.write(w, &f.schema, v)?;
                }
                w.end_object();
            }
            (AvroSchema::Union(u), Avro::Union(index, inner)) => {
                let (branch, tagged) = union_branch(u, index)?;
                if !tagged || matches!(*inner, Avro::Null) {
                    self.write(w, branch, *inner)?;
                } else {
                    w.begin_object();
                    w.key(&union_branch_name(self.resolve(branch)));
                    self.write(w, branch, *inner)?;
                    w.end_object();
                }
            }
            (_, other) => return Err(bad(&format!("{other:?}"))),
        }
        Ok(())
    }
}

/// Milliseconds -> microseconds, refusing values that overflow.
fn millis(ms: i64) -> Result<i64, DecodeError> {
    crate::record::values::millis_to_micros(ms).ok_or_else(|| bad("timestamp out of range"))
}

/// JSON has no NaN or infinities: they travel as the strings Arrow's parser reads back.
fn float(f: f64) -> Value {
    match Number::from_f64(f) {
        Some(n) => Value::Number(n),
        None if f.is_nan() => Value::String("NaN".into()),
        None if f > 0.0 => Value::String("inf".into()),
        None => Value::String("-inf".into()),
    }
}

/// Lowercase hex, the encoding Arrow's JSON reader expects for binary columns.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn date(days: i32) -> Result<String, DecodeError> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("valid date");
    epoch
        .checked_add_signed(TimeDelta::days(days as i64))
        .map(|d| d.format("%Y-%m-%d").to_string())
        .ok_or_else(|| bad("date out of range"))
}

fn time_micros(us: i64) -> Result<String, DecodeError> {
    if !(0..86_400_000_000).contains(&us) {
        return Err(bad("time of day out of range"));
    }
    let t = NaiveTime::from_num_seconds_from_midnight_opt(
        (us / 1_000_000) as u32,
        (us % 1_000_000) as u32 * 1000,
    )
    .ok_or_else(|| bad("time of day out of range"))?;
    Ok(t.format("%H:%M:%S%.6f").to_string())
}

fn timestamp_micros(us: i64, utc: bool) -> Result<String, DecodeError> {
    let t = DateTime::from_timestamp_micros(us).ok_or_else(|| bad("timestamp out of range"))?;
    let naive = t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f");
    Ok(if utc {
        format!("{naive}Z")
    } else {
        naive.to_string()
    })
}

/// The exact decimal text of a big-endian two's complement unscaled value.
fn decimal_text(bytes: &[u8], scale: usize) -> String {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    // Magnitude as base-10 digits, by repeated division of the big-endian bytes.
    let mut mag: Vec<u8> = if negative {
        // Two's complement negation: invert and add one.
        let mut v: Vec<u8> = bytes.iter().map(|b| !b).collect();
        for b in v.iter_mut().rev() {
            let (n, carry) = b.overflowing_add(1);
            *b = n;
            if !carry {
                break;
            }
        }
        v
    } else {
        bytes.to_vec()
    };
    let mut digits = Vec::new();
    while mag.iter().any(|&b| b != 0) {
        let mut rem = 0u32;
        for b in mag.iter_mut() {
            let cur = (rem << 8) | *b as u32;
            *b = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    while digits.len() <= scale {
        digits.push(b'0');
    }
    digits.reverse();
    let (int, frac) = digits.split_at(digits.len() - scale);
    let mut s = String::with_capacity(digits.len() + 2);
    if negative {
        s.push('-');
    }
    s.push_str(std::str::from_utf8(int).expect("ascii digits"));
    if scale > 0 {
        s.push('.');
        s.push_str(std::str::from_utf8(frac).expect("ascii digits"));
    }
    s
}

#[cfg(test)]
mod tests;
