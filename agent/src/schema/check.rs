//! Checking one record against the known columns before anything is learned from it.
//!
//! Besides type conflicts the walk notes the columns the record would add (for the
//! `max_columns` limit and Iceberg's unique full names) and how deep it nests.

use std::borrow::Cow;

use iceberg::spec::{PrimitiveType, StructType, Type};
use indexmap::IndexMap;

use super::evolve::{widening, widest};
use super::layout::{NameCache, node_names};
use super::{
    Conflict, Ctx, Kind, Node, RESERVED_COLUMNS, Rejection, SchemaOptions, accepts, describe,
    list_hint, merge_value, prim, push_full, push_path, struct_hint, type_name, value_desc,
};
use crate::record::json::{Arr, Obj, Value};
use crate::record::values::timestamp_shape;

/// The columns a record would add, by Iceberg full name.
#[derive(Debug, Default)]
pub(super) struct Fresh {
    names: Vec<String>,
    /// A field without a type got a value (even one that makes no column yet, like `[]`).
    learns: bool,
}

impl Fresh {
    /// Whether the record adds no column.
    pub(super) fn adds_nothing(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether the tracker learns something from the record.
    pub(super) fn learns(&self) -> bool {
        self.learns
    }

    /// Whether adding these columns keeps names unique and stays within `max_columns`.
    pub(super) fn admissible(
        &self,
        known: &NameCache,
        options: &SchemaOptions,
    ) -> Result<(), Rejection> {
        if known.count() + self.names.len() > options.max_columns {
            return Err(Rejection::TooManyColumns {
                adding: self.names.len(),
                have: known.count(),
                max: options.max_columns,
            });
        }
        let mut seen = std::collections::HashSet::with_capacity(self.names.len());
        for name in &self.names {
            if known.contains(name) || !seen.insert(name.as_str()) {
                return Err(Rejection::NameCollision(name.clone()));
            }
        }
        Ok(())
    }
}

/// One step of the way from the record's top to a value.
enum Seg<'r> {
    /// A field name.
    Name(Cow<'r, str>),
    /// The element of a list.
    Element,
}

/// Where the walk is (the names on the way, turned into text only when a message, an
/// override or a new column needs it), how deep, and the columns the record would add.
struct Walk<'a, 'r> {
    options: &'a SchemaOptions,
    segs: Vec<Seg<'r>>,
    depth: usize,
    /// Inside a value whose columns are already being counted.
    in_fresh: bool,
    fresh: Fresh,
}

impl<'r> Walk<'_, 'r> {
    /// The dotted path of the field (list elements have their list's path).
    fn path(&self) -> String {
        let mut out = String::new();
        for s in &self.segs {
            if let Seg::Name(n) = s {
                push_path(&mut out, n);
            }
        }
        out
    }

    /// The Iceberg full name (list elements named `element`).
    fn full(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.segs.iter().enumerate() {
            match s {
                Seg::Name(n) => push_full(&mut out, n, i == 0),
                Seg::Element => push_full(&mut out, "element", i == 0),
            };
        }
        out
    }

    fn override_type(&self) -> Option<&Type> {
        if self.options.overrides.is_empty() {
            return None;
        }
        self.options.overrides.get(self.path().as_str())
    }

    fn enter(&mut self) -> Result<(), Rejection> {
        self.depth += 1;
        if self.depth > self.options.max_depth {
            return Err(Rejection::TooDeep {
                path: self.path(),
                depth: self.depth,
                max: self.options.max_depth,
            });
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn conflict(&self, column: String, v: Value<'_>) -> Rejection {
        Rejection::Conflict(Conflict {
            path: self.path(),
            column,
            value: value_desc(v),
        })
    }
}

/// Checks a whole record; returns the columns it would add.
pub(super) fn check_record(
    fields: &IndexMap<String, Node>,
    record: Obj<'_>,
    hints: Option<&StructType>,
    options: &SchemaOptions,
) -> Result<Fresh, Rejection> {
    let mut walk = Walk {
        options,
        segs: Vec::new(),
        depth: 0,
        in_fresh: false,
        fresh: Fresh::default(),
    };
    check_object(fields, record, hints, &mut walk, true)?;
    Ok(walk.fresh)
}

fn check_object<'r>(
    fields: &IndexMap<String, Node>,
    record: Obj<'r>,
    hints: Option<&StructType>,
    walk: &mut Walk<'_, 'r>,
    top: bool,
) -> Result<(), Rejection> {
    for (key, value) in record.iter() {
        let name = key.get();
        if top && RESERVED_COLUMNS.contains(&name.as_ref()) {
            continue;
        }
        let hint = hints
            .and_then(|h| h.field_by_name(&name))
            .map(|f| &*f.field_type);
        let node = fields.get(name.as_ref());
        walk.segs.push(Seg::Name(name));
        match node {
            Some(node) => check_value(node, value, hint, walk)?,
            None => fresh(value, hint, walk)?,
        }
        walk.segs.pop();
    }
    Ok(())
}

/// A value of a field that has no type yet: valid on its own, and the columns it would
/// add are noted (by learning it on a scratch node).
fn fresh<'r>(v: Value<'r>, hint: Option<&Type>, walk: &mut Walk<'_, 'r>) -> Result<(), Rejection> {
    if v.is_null() {
        return Ok(());
    }
    walk.fresh.learns = true;
    let outer = walk.in_fresh;
    walk.in_fresh = true;
    let valid = validate_fresh(v, walk);
    walk.in_fresh = outer;
    valid?;
    if !outer {
        let mut ctx = Ctx {
            options: walk.options,
            path: walk.path(),
            changed: false,
        };
        let node = Node::create(v, hint, &mut ctx);
        node_names(&node, &mut walk.full(), &mut walk.fresh.names);
    }
    Ok(())
}

/// A new value must fit its override, and the items of each array must agree with
/// each other.
fn validate_fresh<'r>(v: Value<'r>, walk: &mut Walk<'_, 'r>) -> Result<(), Rejection> {
    if let Some(t) = walk.override_type() {
        return if accepts(t, v) {
            Ok(())
        } else {
            Err(walk.conflict(type_name(t), v))
        };
    }
    match v {
        Value::Object(m) => {
            walk.enter()?;
            for (key, child) in m.iter() {
                walk.segs.push(Seg::Name(key.get()));
                validate_fresh(child, walk)?;
                walk.segs.pop();
            }
            walk.leave();
            Ok(())
        }
        Value::Array(items) => {
            walk.enter()?;
            check_items(&Node::unknown(), items, None, walk)?;
            walk.leave();
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Checks the items of one array against its element node *and* each other: the
/// element type is learnt item by item on a copy, so `[false, 0]` is a conflict.
fn check_items<'r>(
    element: &Node,
    items: Arr<'r>,
    hint: Option<&Type>,
    walk: &mut Walk<'_, 'r>,
) -> Result<(), Rejection> {
    walk.segs.push(Seg::Element);
    // A committed primitive element cannot learn: no copy needed.
    let settled = element.locked
        && !matches!(
            element.kind,
            None | Some(Kind::Struct(_)) | Some(Kind::List(_))
        );
    let mut learnt: Option<Node> = None;
    let mut ctx = Ctx {
        options: walk.options,
        path: if settled || walk.options.overrides.is_empty() {
            String::new()
        } else {
            walk.path()
        },
        changed: false,
    };
    let mut items = items.iter().peekable();
    while let Some(item) = items.next() {
        check_value(learnt.as_ref().unwrap_or(element), item, hint, walk)?;
        if !settled && items.peek().is_some() {
            let l = learnt.get_or_insert_with(|| element.clone());
            merge_value(l, item, hint, &mut ctx);
        }
    }
    walk.segs.pop();
    Ok(())
}

fn check_value<'r>(
    node: &Node,
    v: Value<'r>,
    hint: Option<&Type>,
    walk: &mut Walk<'_, 'r>,
) -> Result<(), Rejection> {
    if v.is_null() {
        return Ok(());
    }
    let Some(kind) = &node.kind else {
        return fresh(v, hint, walk);
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
        (Kind::Long, Value::Number(n)) => n.is_i64() || !fixed,
        (Kind::Double, Value::Number(_)) => true,
        (Kind::Double, Value::String(_)) if fixed => accepts(&prim(PrimitiveType::Double), v),
        (Kind::String, Value::String(_)) => true,
        (Kind::Timestamptz, Value::String(s)) => !fixed || timestamp_shape(&s.get()) == Some(true),
        (Kind::Timestamp, Value::String(s)) => !fixed || timestamp_shape(&s.get()) == Some(false),
        (Kind::Struct(fields), Value::Object(m)) => {
            walk.enter()?;
            check_object(fields, m, struct_hint(hint), walk, false)?;
            walk.leave();
            return Ok(());
        }
        (Kind::List(element), Value::Array(items)) => {
            walk.enter()?;
            check_items(element, items, list_hint(hint), walk)?;
            walk.leave();
            return Ok(());
        }
        (Kind::Other(t), v) => accepts(wide.as_ref().unwrap_or(t), v),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(walk.conflict(wide.as_ref().map_or_else(|| describe(kind), type_name), v))
    }
}
