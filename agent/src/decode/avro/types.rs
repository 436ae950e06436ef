//! Avro schema -> Iceberg types (the table in `docs/types.md`).
//!
//! The Iceberg type of an Avro field comes from its schema, never from guessing on the
//! decoded JSON: decimal precision and scale, date, time, timestamp vs timestamptz,
//! uuid, fixed, binary and map all survive exactly. Field ids in the returned types are
//! placeholders (0); the tracker or the table assigns real ones.

use std::collections::HashSet;
use std::sync::Arc;

use apache_avro::Schema as AvroSchema;
use apache_avro::schema::{Name, NamesRef, ResolvedSchema, UnionSchema};
use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};
use indexmap::IndexMap;

/// Iceberg's largest decimal precision; wider Avro decimals become strings.
pub const MAX_DECIMAL_PRECISION: usize = 38;

/// Why an Avro schema cannot describe table columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroMappingError {
    /// The top-level schema must be a record (one row per message).
    #[error("top-level Avro schema is {0}, expected a record")]
    NotARecord(String),
    /// A record refers to itself; Iceberg has no recursive types.
    #[error("recursive Avro type `{0}` cannot become an Iceberg column")]
    Recursive(String),
    /// The schema names a type it does not define.
    #[error("Avro schema: {0}")]
    Invalid(String),
}

/// The payload columns an Avro record schema declares, by name, in schema order.
/// Fields of type `null` (only) have no column.
pub fn record_columns(schema: &AvroSchema) -> Result<IndexMap<String, Type>, AvroMappingError> {
    record_columns_with(schema, &[])
}

/// [`record_columns`] for a schema whose named types may be defined in `schemata`
/// (the schemas of registry references).
pub fn record_columns_with(
    schema: &AvroSchema,
    schemata: &[AvroSchema],
) -> Result<IndexMap<String, Type>, AvroMappingError> {
    // Referenced schemas first: names resolve in order.
    let all: Vec<&AvroSchema> = schemata.iter().chain(std::iter::once(schema)).collect();
    let resolved =
        ResolvedSchema::try_from(all).map_err(|e| AvroMappingError::Invalid(e.to_string()))?;
    let mapper = Mapper {
        names: resolved.get_names(),
    };
    let AvroSchema::Record(record) = mapper.resolve(schema)? else {
        return Err(AvroMappingError::NotARecord(kind_name(schema)));
    };
    let mut seen = HashSet::new();
    seen.insert(record.name.clone());
    let mut out = IndexMap::new();
    for f in &record.fields {
        if let Some(t) = mapper.map(&f.schema, &mut seen)? {
            out.insert(f.name.clone(), t);
        }
    }
    Ok(out)
}

struct Mapper<'a> {
    names: &'a NamesRef<'a>,
}

impl<'a> Mapper<'a> {
    fn resolve<'s>(&'s self, s: &'s AvroSchema) -> Result<&'s AvroSchema, AvroMappingError>
    where
        'a: 's,
    {
        match s {
            AvroSchema::Ref { name } => self
                .names
                .get(name)
                .copied()
                .ok_or_else(|| AvroMappingError::Invalid(format!("unknown type {name}"))),
            other => Ok(other),
        }
    }

    /// `None` for `null`, which has no column.
    fn map(
        &self,
        s: &AvroSchema,
        seen: &mut HashSet<Name>,
    ) -> Result<Option<Type>, AvroMappingError> {
        use PrimitiveType as P;
        let p = |t: P| Ok(Some(Type::Primitive(t)));
        match self.resolve(s)? {
            AvroSchema::Null => Ok(None),
            AvroSchema::Boolean => p(P::Boolean),
            AvroSchema::Int => p(P::Int),
            AvroSchema::Long => p(P::Long),
            AvroSchema::Float => p(P::Float),
            AvroSchema::Double => p(P::Double),
            AvroSchema::Bytes => p(P::Binary),
            AvroSchema::String | AvroSchema::Enum(_) | AvroSchema::BigDecimal => p(P::String),
            AvroSchema::Fixed(f) => p(P::Fixed(f.size as u64)),
            // Iceberg stores a 12-byte Avro duration as the raw fixed bytes.
            AvroSchema::Duration => p(P::Fixed(12)),
            AvroSchema::Decimal(d) if d.precision <= MAX_DECIMAL_PRECISION => p(P::Decimal {
                precision: d.precision as u32,
                scale: d.scale as u32,
            }),
            AvroSchema::Decimal(_) => p(P::String),
            AvroSchema::Uuid => p(P::Uuid),
            AvroSchema::Date => p(P::Date),
            AvroSchema::TimeMillis | AvroSchema::TimeMicros => p(P::Time),
            AvroSchema::TimestampMillis | AvroSchema::TimestampMicros => p(P::Timestamptz),
            AvroSchema::LocalTimestampMillis | AvroSchema::LocalTimestampMicros => p(P::Timestamp),
            // Iceberg's nanosecond timestamp types need format v3 and Floe's tables may
            // be v2, so on every table the value is kept exactly as its Avro base type
            // (`long`).
            AvroSchema::TimestampNanos | AvroSchema::LocalTimestampNanos => p(P::Long),
            AvroSchema::Array(a) => Ok(self.map(&a.items, seen)?.map(|t| {
                Type::List(ListType::new(Arc::new(NestedField::list_element(
                    0, t, false,
                ))))
            })),
            AvroSchema::Map(m) => Ok(self.map(&m.types, seen)?.map(|t| {
                Type::Map(MapType::new(
                    Arc::new(NestedField::map_key_element(0, Type::Primitive(P::String))),
                    Arc::new(NestedField::map_value_element(0, t, false)),
                ))
            })),
            AvroSchema::Union(u) => self.union(u, seen),
            AvroSchema::Record(r) => {
                if !seen.insert(r.name.clone()) {
                    return Err(AvroMappingError::Recursive(r.name.to_string()));
                }
                let mut fields = Vec::new();
                for f in &r.fields {
                    if let Some(t) = self.map(&f.schema, seen)? {
                        fields.push(Arc::new(NestedField::optional(0, f.name.clone(), t)));
                    }
                }
                seen.remove(&r.name);
                Ok(Some(Type::Struct(StructType::new(fields))))
            }
            AvroSchema::Ref { name } => Err(AvroMappingError::Invalid(format!(
                "unresolved reference {name}"
            ))),
        }
    }

    /// `[null, T]` is an optional T; other unions become a struct with one optional
    /// field per non-null branch (see [`union_branch_name`]).
    fn union(
        &self,
        u: &UnionSchema,
        seen: &mut HashSet<Name>,
    ) -> Result<Option<Type>, AvroMappingError> {
        let branches: Vec<&AvroSchema> = u
            .variants()
            .iter()
            .filter(|s| !matches!(s, AvroSchema::Null))
            .collect();
        match branches.as_slice() {
            [] => Ok(None),
            [only] => self.map(only, seen),
            many => {
                let mut fields = Vec::new();
                for b in many {
                    if let Some(t) = self.map(b, seen)? {
                        fields.push(Arc::new(NestedField::optional(
                            0,
                            union_branch_name(self.resolve(b)?),
                            t,
                        )));
                    }
                }
                Ok(Some(Type::Struct(StructType::new(fields))))
            }
        }
    }
}

/// The field name of a union branch when a union has several non-null branches: the
/// simple name of a named type (record, enum, fixed), otherwise the Avro type name
/// (`int`, `string`, `array`, `map`, ... ignoring logical types).
pub fn union_branch_name(s: &AvroSchema) -> String {
    match s {
        AvroSchema::Record(r) => r.name.name.clone(),
        AvroSchema::Enum(e) => e.name.name.clone(),
        AvroSchema::Fixed(f) => f.name.name.clone(),
        AvroSchema::Ref { name } => name.name.clone(),
        AvroSchema::Decimal(d) => union_branch_name(&d.inner),
        AvroSchema::Duration => "fixed".into(),
        AvroSchema::Uuid | AvroSchema::BigDecimal => "string".into(),
        AvroSchema::Date | AvroSchema::TimeMillis => "int".into(),
        AvroSchema::TimeMicros
        | AvroSchema::TimestampMillis
        | AvroSchema::TimestampMicros
        | AvroSchema::TimestampNanos
        | AvroSchema::LocalTimestampMillis
        | AvroSchema::LocalTimestampMicros
        | AvroSchema::LocalTimestampNanos => "long".into(),
        other => kind_name(other),
    }
}

fn kind_name(s: &AvroSchema) -> String {
    let kind: apache_avro::schema::SchemaKind = s.into();
    format!("{kind:?}").to_lowercase()
}
