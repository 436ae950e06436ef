//! Schema stage: infers an Iceberg schema from decoded records, evolves it, and admits,
//! rejects or fails each row.
//!
//! A [`SchemaTracker`] starts from the table's current schema (those columns are
//! *locked*: their type can no longer change) and learns from every record:
//! new fields become new optional columns, also inside structs and list elements.
//! Before a column is first committed its type may still widen
//! (long -> double, timestamp -> string); after that a value of another type is a
//! [`Conflict`] and the record follows the pipeline's `on_incompatible` policy instead of
//! corrupting the column.
//!
//! JSON -> Iceberg: integer -> long, number with fraction -> double, bool -> boolean,
//! ISO-8601 string with offset -> timestamptz, without offset -> timestamp,
//! other string -> string, object -> struct, array -> list. A field that has only
//! been null (or an empty array / object) gets no column until a typed value arrives
//! (or becomes a string after `null_as_string_after` records).
//!
//! Declared types win over guessing: an Avro writer schema ([`SchemaTracker::declare`]
//! and the hints of [`SchemaTracker::observe_json`]) and per-field overrides from the
//! config give the exact Iceberg type, and such a column never widens by inference.
//! A declared widening of a committed column (int -> long, float -> double, decimal
//! precision increase) is kept for [`SchemaTracker::evolved_schema`], and from then on
//! values are checked against the wider type: the sink commits the widened schema in
//! the same snapshot as the data written with it. The full rules are in `docs/types.md`.
//!
//! Records read through [`crate::record::json`]: the tracker walks the parsed tape, never
//! a tree of allocated values. Limits (`max_depth`, `max_columns`) and Iceberg's rule
//! that full column names are unique (`{"host": {"name": 1}, "host.name": 2}`) are
//! checked per record, so one hostile record is rejected alone instead of failing a
//! whole commit.

mod admit;
mod check;
mod evolve;
mod layout;
pub mod options;
mod values;

pub use self::admit::{Admission, Admitted, TableSchema};
pub use self::options::{OnIncompatible, SchemaConfig, SchemaOptions};
pub use self::values::{accepts, type_accepts};

use self::evolve::{widening, widest};

use std::sync::Arc;

use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type,
};
use indexmap::IndexMap;

use crate::record::columns::{self, RESERVED as RESERVED_COLUMNS};
use crate::record::json::{JsonObject, Obj, Value};
use crate::record::values::timestamp_shape;

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

/// Why the schema stage refuses a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A value does not fit its column.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The record nests deeper than `max_depth`.
    #[error("field `{path}` is nested {depth} levels deep; the limit is max_depth = {max}")]
    TooDeep {
        /// Dotted path of the field that crossed the limit.
        path: String,
        /// Its depth.
        depth: usize,
        /// The configured limit.
        max: usize,
    },
    /// The record would take the table past `max_columns`.
    #[error(
        "the record would add {adding} columns to the {have} the table has; the limit is max_columns = {max}"
    )]
    TooManyColumns {
        /// Columns the record would add.
        adding: usize,
        /// Columns known.
        have: usize,
        /// The configured limit.
        max: usize,
    },
    /// Two fields would have the same full column name in Iceberg.
    #[error(
        "field `{0}` collides with another column of the same full name (Iceberg joins nested names with '.')"
    )]
    NameCollision(String),
}

/// Errors of the schema stage other than per-record rejections.
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
#[derive(Debug, Clone)]
pub struct SchemaTracker {
    root: IndexMap<String, Node>,
    options: Arc<SchemaOptions>,
    /// Declared schemas already merged (by address of the shared declaration).
    declared_seen: Vec<usize>,
    /// Bumped whenever a column appears or changes type (the batch stage rebuilds its
    /// builders when it sees a new version).
    version: u64,
    /// Full column names and the column count, cached per `version`.
    names: layout::NameCache,
    /// Per `version`: whether a record that adds no column can change nothing (every
    /// known column committed or declared), so learning from it can be skipped.
    stable: Option<(u64, bool)>,
}

impl PartialEq for SchemaTracker {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root && self.options == other.options
    }
}

impl SchemaTracker {
    /// A tracker with no columns yet (table not created).
    pub fn new() -> Self {
        SchemaTracker {
            root: IndexMap::new(),
            options: Arc::default(),
            declared_seen: Vec::new(),
            version: 0,
            names: layout::NameCache::default(),
            stable: None,
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
            ..SchemaTracker::new()
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

    /// Changes whenever a column appears or changes type.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Checks a record against the known columns and, if it fits, learns its new fields.
    /// A record that is rejected leaves the tracker unchanged.
    pub fn observe_json(
        &mut self,
        record: Obj<'_>,
        hints: Option<&StructType>,
    ) -> Result<(), Rejection> {
        let fresh = check::check_record(&self.root, record, hints, &self.options)?;
        if !fresh.adds_nothing() {
            self.names.refresh(&self.root, self.version);
            fresh.admissible(&self.names, &self.options)?;
        }
        if !fresh.learns() && hints.is_none() && self.is_stable() {
            // The common case once the table exists: nothing to learn.
            return Ok(());
        }
        let mut ctx = Ctx {
            options: &self.options,
            path: String::new(),
            changed: false,
        };
        merge_object(&mut self.root, record, hints, &mut ctx);
        if ctx.changed {
            self.version += 1;
        }
        Ok(())
    }

    fn is_stable(&mut self) -> bool {
        if let Some((v, stable)) = self.stable
            && v == self.version
        {
            return stable;
        }
        let waits_for_nulls = self.options.null_as_string_after.is_some();
        fn settled(node: &Node, waits_for_nulls: bool) -> bool {
            match &node.kind {
                None => !waits_for_nulls,
                Some(kind) => {
                    node.fixed()
                        && match kind {
                            Kind::Struct(children) => {
                                children.values().all(|c| settled(c, waits_for_nulls))
                            }
                            Kind::List(element) => settled(element, waits_for_nulls),
                            _ => true,
                        }
                }
            }
        }
        let stable = self.root.values().all(|n| settled(n, waits_for_nulls));
        self.stable = Some((self.version, stable));
        stable
    }

    /// [`observe_json`](Self::observe_json) for a `serde_json` map (tests and tools).
    pub fn observe(
        &mut self,
        record: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), Rejection> {
        self.observe_with(record, None)
    }

    /// [`observe_json`](Self::observe_json) with hints, for a `serde_json` map.
    pub fn observe_with(
        &mut self,
        record: &serde_json::Map<String, serde_json::Value>,
        hints: Option<&StructType>,
    ) -> Result<(), Rejection> {
        let o = JsonObject::from_map(record);
        self.observe_json(o.view().root(), hints)
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
        self.version += 1;
    }

    /// Rewrites values that conflict with a string column into their JSON text (the
    /// `coerce` policy). Returns the rewritten record, or `None` if nothing needed it.
    pub fn coerce(&self, record: Obj<'_>) -> Option<JsonObject> {
        values::coerce_object(&self.root, record)
    }

    /// Columns learned since the tracker was built, ready to add to the table.
    pub fn additions(&self) -> Vec<Addition> {
        let mut out = Vec::new();
        collect_additions(&self.root, None, &mut out);
        out
    }

    /// Marks every known column as committed: called when the buffered rows are handed
    /// to the committer, so later rows are checked against the types that commit
    /// writes. Pending declared widenings take effect.
    pub fn lock_all(&mut self) {
        fn lock(node: &mut Node) {
            if node.kind.is_none() {
                return;
            }
            node.locked = true;
            if let Some(w) = node.widen.take() {
                node.kind = Some(Kind::Other(w));
            }
            match &mut node.kind {
                Some(Kind::Struct(children)) => children.values_mut().for_each(lock),
                Some(Kind::List(element)) => lock(element),
                _ => {}
            }
        }
        self.root.values_mut().for_each(lock);
        self.version += 1;
    }

    /// The full table schema for a new table: the `_kafka_*` columns, then every payload column.
    pub fn new_table_schema(&self) -> Result<Schema, SchemaError> {
        let mut next_id = 0;
        let mut id = || {
            next_id += 1;
            next_id
        };
        let mut fields: Vec<NestedFieldRef> = columns::kafka_fields(
            &mut id,
            self.options.topic_column,
            self.options.headers_column,
        );
        for a in self.additions() {
            fields.push(Arc::new(NestedField::optional(
                id(),
                a.name,
                renumber(&a.field_type, &mut id),
            )));
        }
        Ok(Schema::builder().with_fields(fields).build()?)
    }

    /// The payload columns rows are buffered in: every known column with its current
    /// type, except that a timestamp column whose type may still change is buffered as
    /// its text (converted when the buffer is written, so nothing is lost if it turns
    /// into a string column).
    pub fn buffer_type(&self) -> StructType {
        layout::buffer_type(&self.root)
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
    fn create(v: Value<'_>, hint: Option<&Type>, ctx: &mut Ctx<'_>) -> Node {
        let declared = ctx
            .options
            .overrides
            .get(&ctx.path)
            .or(hint.filter(|t| accepts(t, v)));
        let mut node = match declared {
            Some(t) => Node::from_type(t, false),
            None => Node::unknown(),
        };
        merge_value(&mut node, v, hint, ctx);
        node
    }

    fn infer(v: Value<'_>, hint: Option<&Type>, ctx: &mut Ctx<'_>) -> Option<Kind> {
        match v {
            Value::Null => None,
            Value::Bool(_) => Some(Kind::Boolean),
            Value::Number(n) if n.is_i64() => Some(Kind::Long),
            Value::Number(_) => Some(Kind::Double),
            Value::String(s) => Some(string_kind(&s.get(), ctx.options)),
            Value::Object(m) => {
                let mut fields = IndexMap::new();
                merge_object(&mut fields, m, struct_hint(hint), ctx);
                Some(Kind::Struct(fields))
            }
            Value::Array(items) => {
                let mut element = Node::unknown();
                let element_hint = list_hint(hint);
                for item in items.iter() {
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

/// A short description of a value for conflict messages.
fn value_desc(v: Value<'_>) -> String {
    match v {
        Value::String(s) if s.raw().len() <= 40 => format!("string {:?}", s.get()),
        Value::Number(n) => format!("{} {}", v.kind_name(), n.text()),
        other => other.kind_name().to_string(),
    }
}

/// Where a merge is in the record, and the settings it follows.
struct Ctx<'a> {
    options: &'a SchemaOptions,
    /// Dotted path of the field being merged (for overrides).
    path: String,
    /// Whether a column appeared or changed type.
    changed: bool,
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

/// Appends `name` to an Iceberg full name: names are joined with '.' below the root,
/// also after a parent whose name is empty (`{"": {"k": 1}}` is `.k`, which collides
/// with a top-level `.k`): admission must see that collision, or the whole batch fails
/// when the table schema is built.
fn push_full(full: &mut String, name: &str, root: bool) -> usize {
    let len = full.len();
    if !root {
        full.push('.');
    }
    full.push_str(name);
    len
}

fn prim(p: PrimitiveType) -> Type {
    Type::Primitive(p)
}

fn merge_object(
    fields: &mut IndexMap<String, Node>,
    record: Obj<'_>,
    hints: Option<&StructType>,
    ctx: &mut Ctx<'_>,
) {
    for (key, value) in record.iter() {
        let name = key.get();
        let hint = hints
            .and_then(|h| h.field_by_name(&name))
            .map(|f| &*f.field_type);
        let len = push_path(&mut ctx.path, &name);
        match fields.get_mut(name.as_ref()) {
            Some(node) => merge_value(node, value, hint, ctx),
            None => {
                let node = Node::create(value, hint, ctx);
                ctx.changed |= node.is_known();
                fields.insert(name.into_owned(), node);
            }
        }
        ctx.path.truncate(len);
    }
}

/// Widens `node` so that it holds `v` (the value was checked before).
fn merge_value(node: &mut Node, v: Value<'_>, hint: Option<&Type>, ctx: &mut Ctx<'_>) {
    if v.is_null() {
        if node.kind.is_none() {
            node.nulls += 1;
            if ctx
                .options
                .null_as_string_after
                .is_some_and(|n| node.nulls >= n)
            {
                node.kind = Some(Kind::String);
                ctx.changed = true;
            }
        }
        return;
    }
    let fixed = node.fixed();
    let Some(kind) = &mut node.kind else {
        node.kind = Node::infer(v, hint, ctx);
        ctx.changed |= node.is_known();
        return;
    };
    match (kind, v) {
        (Kind::Struct(fields), Value::Object(m)) => merge_object(fields, m, struct_hint(hint), ctx),
        (Kind::List(element), Value::Array(items)) => {
            let element_hint = list_hint(hint);
            for item in items.iter() {
                merge_value(element, item, element_hint, ctx);
            }
        }
        (k @ Kind::Long, Value::Number(n)) if !n.is_i64() && !fixed => {
            *k = Kind::Double;
            ctx.changed = true;
        }
        // A hint (the writer schema seen through plugins) that safely widens the column
        // widens it like a declaration, also for values the column could hold: a double
        // stored in a float column would lose precision.
        (Kind::Other(t), v) => {
            if let Some(wide) = hint.and_then(|h| widening(t, h))
                && accepts(&wide, v)
            {
                if node.locked {
                    let before = node.widen.clone();
                    node.widen = widest(node.widen.take(), Some(wide));
                    ctx.changed |= node.widen != before;
                } else {
                    *t = wide;
                    ctx.changed = true;
                }
            }
        }
        (k @ (Kind::Timestamptz | Kind::Timestamp), Value::String(s)) if !fixed => {
            let seen = string_kind(&s.get(), ctx.options);
            if seen != *k {
                *k = Kind::String;
                ctx.changed = true;
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
