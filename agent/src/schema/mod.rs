//! Schema stage: infers an Iceberg schema from decoded records and evolves it.
//!
//! A [`SchemaTracker`] starts from the table's current schema (those columns are
//! *locked*: their type can no longer change) and learns from every record:
//! new fields become new optional columns, also inside structs and list elements.
//! Before a column is first committed its type may still widen
//! (long -> double, timestamp -> string); after that a value of another type is a
//! [`Conflict`] and the record goes to the dead-letter path instead of corrupting the column.
//!
//! JSON -> Iceberg: integer -> long, number with fraction -> double, bool -> boolean,
//! ISO-8601 string with offset -> timestamptz, without offset -> timestamp,
//! other string -> string, object -> struct, array -> list. A field that has only
//! been null (or an empty array / object) gets no column until a typed value arrives
//! (or becomes a string after `null_as_string_after` records).
//!
//! Declared types win over guessing: an Avro writer schema ([`SchemaTracker::declare`]
//! and the hints of [`SchemaTracker::observe_with`]) and per-field overrides from the
//! config give the exact Iceberg type, and such a column never widens by inference.
//! A declared widening of a committed column (int -> long, float -> double, decimal
//! precision increase) is kept for [`SchemaTracker::evolved_schema`], and from then on
//! values are checked against the wider type: the sink commits the widened schema in
//! the same snapshot as the data written with it. The full rules are in `docs/types.md`.

pub mod avro;
mod evolve;
pub mod options;
mod values;

pub use self::options::{OnIncompatible, SchemaConfig, SchemaOptions};
pub use self::values::type_accepts;

use self::evolve::{widening, widest};

use std::sync::Arc;

use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type,
};
use indexmap::IndexMap;
use serde_json::{Map, Value};

use crate::decode::json_kind;

/// Columns the agent adds to rows; payload fields with these names are ignored.
/// `_op` (insert / update) exists in upsert tables only.
pub const RESERVED_COLUMNS: [&str; 5] = [
    "_kafka_partition",
    "_kafka_offset",
    "_kafka_timestamp",
    "_kafka_key",
    "_op",
];

/// A value whose type does not fit the column it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{path}`: column is {column}, value is {value}")]
pub struct Conflict {
    /// Dotted path of the field.
    pub path: String,
    /// The column's type.
    pub column: String,
    /// What the record carried.
    pub value: String,
}

/// Errors of the schema stage other than per-record conflicts.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Building an Iceberg schema failed.
    #[error("cannot build Iceberg schema: {0}")]
    Iceberg(#[from] iceberg::Error),
}

/// Inferred type of one field.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Boolean,
    Long,
    Double,
    String,
    Timestamptz,
    Timestamp,
    Struct(IndexMap<String, Node>),
    List(Box<Node>),
    /// A table column of a type JSON inference never produces (int, date, decimal, map...).
    Other(Type),
}

/// One field: its kind (unknown while only nulls were seen) and whether it is in the table.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    kind: Option<Kind>,
    /// In the committed table schema: the type cannot change by inference.
    locked: bool,
    /// Declared (Avro schema or override): the type does not widen by inference either.
    declared: bool,
    /// Records in which the field was null while its type was unknown.
    nulls: u64,
    /// A declared safe widening of a locked column, applied by `evolved_schema`.
    widen: Option<Type>,
}

impl Node {
    fn unknown() -> Node {
        Node {
            kind: None,
            locked: false,
            declared: false,
            nulls: 0,
            widen: None,
        }
    }

    /// Types are fixed once committed or declared.
    fn fixed(&self) -> bool {
        self.locked || self.declared
    }
}

/// A column to add to the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Addition {
    /// Dotted path of the parent struct (or list whose element is the struct); `None` at top level.
    pub parent: Option<String>,
    /// Name of the new field.
    pub name: String,
    /// Its type (nested field ids are placeholders; the table assigns real ones).
    pub field_type: Type,
}

/// Learns the payload schema of a stream of records.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaTracker {
    root: IndexMap<String, Node>,
    options: Arc<SchemaOptions>,
    /// Declared schemas already merged (by address of the shared declaration).
    declared_seen: Vec<usize>,
}

impl SchemaTracker {
    /// A tracker with no columns yet (table not created).
    pub fn new() -> Self {
        SchemaTracker {
            root: IndexMap::new(),
            options: Arc::default(),
            declared_seen: Vec::new(),
        }
    }

    /// A tracker whose columns are those of an existing table, all locked.
    pub fn from_table(schema: &Schema) -> Self {
        let root = schema
            .as_struct()
            .fields()
            .iter()
            .filter(|f| !RESERVED_COLUMNS.contains(&f.name.as_str()))
            .map(|f| (f.name.clone(), Node::from_type(&f.field_type, true)))
            .collect();
        SchemaTracker {
            root,
            options: Arc::default(),
            declared_seen: Vec::new(),
        }
    }

    /// The pipeline's schema settings this tracker follows.
    pub fn options(&self) -> &Arc<SchemaOptions> {
        &self.options
    }

    /// The same tracker with the pipeline's schema settings.
    pub fn with_options(mut self, options: Arc<SchemaOptions>) -> Self {
        self.options = options;
        self
    }

    /// Checks a record against the known columns and, if it fits, learns its new fields.
    /// A record that conflicts leaves the tracker unchanged.
    pub fn observe(&mut self, record: &Map<String, Value>) -> Result<(), Conflict> {
        self.observe_with(record, None)
    }

    /// [`observe`](Self::observe) with declared types as hints: a new field whose value
    /// fits its declared type (e.g. from the Avro writer schema) gets that type instead of
    /// an inferred one, and a hint that safely widens a column (int -> long, float ->
    /// double, decimal precision increase) widens it for [`evolved_schema`](Self::evolved_schema)
    /// when the field has a value.
    pub fn observe_with(
        &mut self,
        record: &Map<String, Value>,
        hints: Option<&StructType>,
    ) -> Result<(), Conflict> {
        let mut path = String::new();
        check_object(&self.root, record, hints, &mut path, &self.options)?;
        let mut ctx = Ctx {
            options: &self.options,
            path: String::new(),
        };
        merge_object(&mut self.root, record, hints, &mut ctx);
        Ok(())
    }

    /// Merges a declared record schema once (later calls with the same `Arc` are free):
    /// its fields become columns even while their values are null, declared safe
    /// widenings of committed columns are kept for [`evolved_schema`](Self::evolved_schema).
    /// A declared type that is incompatible with a column is ignored here; the values
    /// then conflict record by record and follow the pipeline's policy.
    pub fn declare(&mut self, columns: &Arc<StructType>) {
        let key = Arc::as_ptr(columns) as usize;
        if self.declared_seen.contains(&key) {
            return;
        }
        self.declared_seen.push(key);
        evolve::declare_fields(&mut self.root, columns);
    }

    /// Rewrites values that conflict with a string column into their JSON text (the
    /// `coerce` policy). Returns whether anything was rewritten.
    pub fn coerce(&self, record: &mut Map<String, Value>) -> bool {
        values::coerce_object(&self.root, record)
    }

    /// Columns learned since the tracker was built, ready to add to the table.
    pub fn additions(&self) -> Vec<Addition> {
        let mut out = Vec::new();
        collect_additions(&self.root, None, &mut out);
        out
    }

    /// The full table schema for a new table: the `_kafka_*` columns, then every payload column.
    pub fn new_table_schema(&self) -> Result<Schema, SchemaError> {
        let mut next_id = 0;
        let mut id = || {
            next_id += 1;
            next_id
        };
        let mut fields: Vec<NestedFieldRef> = vec![
            Arc::new(NestedField::required(
                id(),
                "_kafka_partition",
                Type::Primitive(PrimitiveType::Int),
            )),
            Arc::new(NestedField::required(
                id(),
                "_kafka_offset",
                Type::Primitive(PrimitiveType::Long),
            )),
            Arc::new(NestedField::optional(
                id(),
                "_kafka_timestamp",
                Type::Primitive(PrimitiveType::Timestamptz),
            )),
            Arc::new(NestedField::optional(
                id(),
                "_kafka_key",
                Type::Primitive(PrimitiveType::String),
            )),
        ];
        for a in self.additions() {
            fields.push(Arc::new(NestedField::optional(
                id(),
                a.name,
                renumber(&a.field_type, &mut id),
            )));
        }
        Ok(Schema::builder().with_fields(fields).build()?)
    }
}

impl Default for SchemaTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Node {
    /// A node of a table type: `locked` for committed columns, otherwise declared.
    fn from_type(t: &Type, locked: bool) -> Node {
        let kind = match t {
            Type::Primitive(PrimitiveType::Boolean) => Kind::Boolean,
            Type::Primitive(PrimitiveType::Long) => Kind::Long,
            Type::Primitive(PrimitiveType::Double) => Kind::Double,
            Type::Primitive(PrimitiveType::String) => Kind::String,
            Type::Primitive(PrimitiveType::Timestamptz) => Kind::Timestamptz,
            Type::Primitive(PrimitiveType::Timestamp) => Kind::Timestamp,
            Type::Struct(s) => Kind::Struct(
                s.fields()
                    .iter()
                    .map(|f| (f.name.clone(), Node::from_type(&f.field_type, locked)))
                    .collect(),
            ),
            Type::List(l) => Kind::List(Box::new(Node::from_type(
                &l.element_field.field_type,
                locked,
            ))),
            other => Kind::Other(other.clone()),
        };
        Node {
            kind: Some(kind),
            locked,
            declared: !locked,
            ..Node::unknown()
        }
    }

    /// A new field: its override or fitting hint if any, else inferred from the value.
    fn create(v: &Value, hint: Option<&Type>, ctx: &mut Ctx<'_>) -> Node {
        let declared = ctx
            .options
            .overrides
            .get(&ctx.path)
            .or(hint.filter(|t| type_accepts(t, v)));
        let mut node = match declared {
            Some(t) => Node::from_type(t, false),
            None => Node::unknown(),
        };
        merge_value(&mut node, v, hint, ctx);
        node
    }

    fn infer(v: &Value, hint: Option<&Type>, ctx: &mut Ctx<'_>) -> Option<Kind> {
        match v {
            Value::Null => None,
            Value::Bool(_) => Some(Kind::Boolean),
            Value::Number(n) if n.is_i64() => Some(Kind::Long),
            Value::Number(_) => Some(Kind::Double),
            Value::String(s) => Some(string_kind(s, ctx.options)),
            Value::Object(m) => {
                let mut fields = IndexMap::new();
                merge_object(&mut fields, m, struct_hint(hint), ctx);
                Some(Kind::Struct(fields))
            }
            Value::Array(items) => {
                let mut element = Node::unknown();
                let element_hint = list_hint(hint);
                for item in items {
                    merge_value(&mut element, item, element_hint, ctx);
                }
                Some(Kind::List(Box::new(element)))
            }
        }
    }

    /// Whether this field carries enough type information to become a column.
    fn is_known(&self) -> bool {
        match &self.kind {
            None => false,
            Some(Kind::Struct(fields)) => fields.values().any(Node::is_known),
            Some(Kind::List(element)) => element.is_known(),
            Some(_) => true,
        }
    }

    /// The Iceberg type of a known node (unknown children are left out).
    fn iceberg_type(&self) -> Option<Type> {
        if !self.is_known() {
            return None;
        }
        Some(match self.kind.as_ref()? {
            Kind::Boolean => Type::Primitive(PrimitiveType::Boolean),
            Kind::Long => Type::Primitive(PrimitiveType::Long),
            Kind::Double => Type::Primitive(PrimitiveType::Double),
            Kind::String => Type::Primitive(PrimitiveType::String),
            Kind::Timestamptz => Type::Primitive(PrimitiveType::Timestamptz),
            Kind::Timestamp => Type::Primitive(PrimitiveType::Timestamp),
            Kind::Struct(fields) => Type::Struct(StructType::new(
                fields
                    .iter()
                    .filter_map(|(name, n)| {
                        n.iceberg_type()
                            .map(|t| Arc::new(NestedField::optional(0, name.clone(), t)))
                    })
                    .collect(),
            )),
            Kind::List(element) => Type::List(ListType::new(Arc::new(NestedField::list_element(
                0,
                element.iceberg_type()?,
                false,
            )))),
            Kind::Other(t) => t.clone(),
        })
    }
}

fn string_kind(s: &str, options: &SchemaOptions) -> Kind {
    if !options.detect_timestamps {
        return Kind::String;
    }
    match timestamp_shape(s) {
        Some(true) => Kind::Timestamptz,
        Some(false) => Kind::Timestamp,
        None => Kind::String,
    }
}

/// `Some(true)` for an ISO-8601 date-time with an offset, `Some(false)` without one,
/// `None` for anything else. Strict on purpose: dates alone or free text stay strings.
pub fn timestamp_shape(s: &str) -> Option<bool> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let shape = b.len() >= 19
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && (b[10] == b'T' || b[10] == b' ')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return None;
        }
        rest = &frac[n..];
    }
    let with_offset = match rest {
        "" => false,
        "Z" | "z" => true,
        _ => {
            let o = rest.as_bytes();
            let sign = o[0] == b'+' || o[0] == b'-';
            let hhmm = o.len() == 6
                && o[3] == b':'
                && o[1..3].iter().chain(&o[4..6]).all(u8::is_ascii_digit);
            let compact = o.len() == 5 && o[1..].iter().all(u8::is_ascii_digit);
            if !(sign && (hhmm || compact)) {
                return None;
            }
            true
        }
    };
    // The shape is right; make sure the values are a real date and time. The fields are
    // read directly: a chrono format string would be parsed again for every value.
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().unwrap_or(u32::MAX);
    let date = chrono::NaiveDate::from_ymd_opt(num(0..4) as i32, num(5..7), num(8..10));
    let time = chrono::NaiveTime::from_hms_opt(num(11..13), num(14..16), num(17..19));
    let offset_ok = match rest.len() {
        6 => {
            rest[1..3].parse::<u32>().is_ok_and(|h| h < 24)
                && rest[4..6].parse::<u32>().is_ok_and(|m| m < 60)
        }
        5 => {
            rest[1..3].parse::<u32>().is_ok_and(|h| h < 24)
                && rest[3..5].parse::<u32>().is_ok_and(|m| m < 60)
        }
        _ => true,
    };
    let parsed = date.is_some() && time.is_some() && offset_ok;
    parsed.then_some(with_offset)
}

fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Boolean => "boolean".into(),
        Kind::Long => "long".into(),
        Kind::Double => "double".into(),
        Kind::String => "string".into(),
        Kind::Timestamptz => "timestamptz".into(),
        Kind::Timestamp => "timestamp".into(),
        Kind::Struct(_) => "struct".into(),
        Kind::List(_) => "list".into(),
        Kind::Other(t) => type_name(t),
    }
}

/// A readable Iceberg type name: `long`, `list<double>`, `struct<a: long, b: string>`.
pub fn type_name(t: &Type) -> String {
    match t {
        Type::Primitive(p) => p.to_string(),
        Type::Struct(s) => {
            let fields: Vec<String> = s
                .fields()
                .iter()
                .map(|f| format!("{}: {}", f.name, type_name(&f.field_type)))
                .collect();
            format!("struct<{}>", fields.join(", "))
        }
        Type::List(l) => format!("list<{}>", type_name(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{}, {}>",
            type_name(&m.key_field.field_type),
            type_name(&m.value_field.field_type)
        ),
    }
}

fn value_desc(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() <= 40 => format!("string {s:?}"),
        Value::Number(n) => format!("{} {n}", json_kind(v)),
        other => json_kind(other).to_string(),
    }
}

/// Where a merge is in the record, and the settings it follows.
struct Ctx<'a> {
    options: &'a SchemaOptions,
    /// Dotted path of the field being merged (for overrides).
    path: String,
}

fn struct_hint(hint: Option<&Type>) -> Option<&StructType> {
    match hint {
        Some(Type::Struct(s)) => Some(s),
        _ => None,
    }
}

fn list_hint(hint: Option<&Type>) -> Option<&Type> {
    match hint {
        Some(Type::List(l)) => Some(&l.element_field.field_type),
        _ => None,
    }
}

fn push_path(path: &mut String, name: &str) -> usize {
    let len = path.len();
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(name);
    len
}

fn check_object(
    fields: &IndexMap<String, Node>,
    record: &Map<String, Value>,
    hints: Option<&StructType>,
    path: &mut String,
    options: &SchemaOptions,
) -> Result<(), Conflict> {
    for (name, value) in record {
        if path.is_empty() && RESERVED_COLUMNS.contains(&name.as_str()) {
            continue;
        }
        let hint = hints
            .and_then(|h| h.field_by_name(name))
            .map(|f| &*f.field_type);
        let len = push_path(path, name);
        match fields.get(name) {
            Some(node) => check_value(node, value, hint, path, options)?,
            None => check_fresh(value, path, options)?,
        }
        path.truncate(len);
    }
    Ok(())
}

/// Checks a value of a field that has no type yet: it must fit its override, and the
/// elements of each array must agree with each other.
fn check_fresh(v: &Value, path: &mut String, options: &SchemaOptions) -> Result<(), Conflict> {
    if let Some(t) = options.overrides.get(path.as_str()) {
        return if type_accepts(t, v) {
            Ok(())
        } else {
            Err(Conflict {
                path: path.clone(),
                column: type_name(t),
                value: value_desc(v),
            })
        };
    }
    match v {
        Value::Object(m) => {
            for (name, child) in m {
                let len = push_path(path, name);
                check_fresh(child, path, options)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Array(items) => check_items(&Node::unknown(), items, None, path, options),
        _ => Ok(()),
    }
}

/// Checks the items of one array against its element node *and* each other: the
/// element type is learnt item by item on a copy, so `[false, 0]` is a conflict.
fn check_items(
    element: &Node,
    items: &[Value],
    hint: Option<&Type>,
    path: &mut String,
    options: &SchemaOptions,
) -> Result<(), Conflict> {
    // One item cannot disagree with a sibling; a committed primitive element cannot learn.
    let settled = items.len() <= 1
        || (element.locked
            && !matches!(
                element.kind,
                None | Some(Kind::Struct(_)) | Some(Kind::List(_))
            ));
    if settled {
        for item in items {
            check_value(element, item, hint, path, options)?;
        }
        return Ok(());
    }
    let mut learnt = element.clone();
    let mut ctx = Ctx {
        options,
        path: path.clone(),
    };
    for item in items {
        check_value(&learnt, item, hint, path, options)?;
        merge_value(&mut learnt, item, hint, &mut ctx);
    }
    Ok(())
}

fn check_value(
    node: &Node,
    v: &Value,
    hint: Option<&Type>,
    path: &mut String,
    options: &SchemaOptions,
) -> Result<(), Conflict> {
    if v.is_null() {
        return Ok(());
    }
    let Some(kind) = &node.kind else {
        return check_fresh(v, path, options);
    };
    let fixed = node.fixed();
    // A declared widening is committed with the data that needs it: the value only has
    // to fit the wider type.
    let wide = match kind {
        Kind::Other(t) => widest(node.widen.clone(), hint.and_then(|h| widening(t, h))),
        _ => None,
    };
    let ok = match (kind, v) {
        (Kind::Boolean, Value::Bool(_)) => true,
        (Kind::Long, Value::Number(n)) => n.is_i64() || (!fixed && n.is_f64()),
        (Kind::Double, Value::Number(n)) => n.is_i64() || n.is_f64(),
        (Kind::Double, Value::String(_)) if fixed => type_accepts(&prim(PrimitiveType::Double), v),
        (Kind::String, Value::String(_)) => true,
        (Kind::Timestamptz, Value::String(s)) => !fixed || timestamp_shape(s) == Some(true),
        (Kind::Timestamp, Value::String(s)) => !fixed || timestamp_shape(s) == Some(false),
        (Kind::Struct(fields), Value::Object(m)) => {
            return check_object(fields, m, struct_hint(hint), path, options);
        }
        (Kind::List(element), Value::Array(items)) => {
            return check_items(element, items, list_hint(hint), path, options);
        }
        (Kind::Other(t), v) => type_accepts(wide.as_ref().unwrap_or(t), v),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Conflict {
            path: path.clone(),
            column: wide.as_ref().map_or_else(|| describe(kind), type_name),
            value: value_desc(v),
        })
    }
}

fn prim(p: PrimitiveType) -> Type {
    Type::Primitive(p)
}

fn merge_object(
    fields: &mut IndexMap<String, Node>,
    record: &Map<String, Value>,
    hints: Option<&StructType>,
    ctx: &mut Ctx<'_>,
) {
    for (name, value) in record {
        let hint = hints
            .and_then(|h| h.field_by_name(name))
            .map(|f| &*f.field_type);
        let len = push_path(&mut ctx.path, name);
        match fields.get_mut(name) {
            Some(node) => merge_value(node, value, hint, ctx),
            None => {
                let node = Node::create(value, hint, ctx);
                fields.insert(name.clone(), node);
            }
        }
        ctx.path.truncate(len);
    }
}

/// Widens `node` so that it holds `v` (the value was checked before).
fn merge_value(node: &mut Node, v: &Value, hint: Option<&Type>, ctx: &mut Ctx<'_>) {
    if v.is_null() {
        if node.kind.is_none() {
            node.nulls += 1;
            if ctx
                .options
                .null_as_string_after
                .is_some_and(|n| node.nulls >= n)
            {
                node.kind = Some(Kind::String);
            }
        }
        return;
    }
    let fixed = node.fixed();
    let Some(kind) = &mut node.kind else {
        node.kind = Node::infer(v, hint, ctx);
        return;
    };
    match (kind, v) {
        (Kind::Struct(fields), Value::Object(m)) => merge_object(fields, m, struct_hint(hint), ctx),
        (Kind::List(element), Value::Array(items)) => {
            let element_hint = list_hint(hint);
            for item in items {
                merge_value(element, item, element_hint, ctx);
            }
        }
        (k @ Kind::Long, Value::Number(n)) if n.is_f64() && !fixed => *k = Kind::Double,
        // A hint (the writer schema seen through plugins) that safely widens the column
        // widens it like a declaration, also for values the column could hold: a double
        // stored in a float column would lose precision.
        (Kind::Other(t), v) => {
            if let Some(wide) = hint.and_then(|h| widening(t, h))
                && type_accepts(&wide, v)
            {
                if node.locked {
                    node.widen = widest(node.widen.take(), Some(wide));
                } else {
                    *t = wide;
                }
            }
        }
        (k @ (Kind::Timestamptz | Kind::Timestamp), Value::String(s)) if !fixed => {
            let seen = string_kind(s, ctx.options);
            if seen != *k {
                *k = Kind::String;
            }
        }
        _ => {}
    }
}

fn collect_additions(
    fields: &IndexMap<String, Node>,
    parent: Option<&str>,
    out: &mut Vec<Addition>,
) {
    for (name, node) in fields {
        if parent.is_none() && RESERVED_COLUMNS.contains(&name.as_str()) {
            continue;
        }
        let path = match parent {
            Some(p) => format!("{p}.{name}"),
            None => name.clone(),
        };
        if !node.locked {
            if let Some(t) = node.iceberg_type() {
                out.push(Addition {
                    parent: parent.map(str::to_string),
                    name: name.clone(),
                    field_type: t,
                });
            }
            continue;
        }
        match &node.kind {
            Some(Kind::Struct(children)) => collect_additions(children, Some(&path), out),
            Some(Kind::List(element)) => {
                if let Some(Kind::Struct(children)) = &element.kind {
                    collect_additions(children, Some(&path), out);
                }
            }
            _ => {}
        }
    }
}

/// Gives every nested field of a new column a fresh id.
pub(crate) fn renumber(t: &Type, id: &mut impl FnMut() -> i32) -> Type {
    match t {
        Type::Struct(s) => Type::Struct(StructType::new(
            s.fields()
                .iter()
                .map(|f| {
                    Arc::new(NestedField::optional(
                        id(),
                        f.name.clone(),
                        renumber(&f.field_type, id),
                    ))
                })
                .collect(),
        )),
        Type::List(l) => {
            let element_id = id();
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                element_id,
                renumber(&l.element_field.field_type, id),
                l.element_field.required,
            ))))
        }
        Type::Map(m) => {
            let key_id = id();
            let value_id = id();
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(
                    key_id,
                    renumber(&m.key_field.field_type, id),
                )),
                Arc::new(NestedField::map_value_element(
                    value_id,
                    renumber(&m.value_field.field_type, id),
                    m.value_field.required,
                )),
            ))
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
