//! Checking one record against the known columns before anything is learned from it.
//!
//! Besides type conflicts the walk notes the columns the record would add (for the
//! `max_columns` limit and Iceberg's unique full names) and how deep it nests.

use iceberg::spec::{PrimitiveType, StructType, Type};
use indexmap::IndexMap;

use super::evolve::{widening, widest};
use super::layout::{NameCache, node_names};
use super::{
    Conflict, Ctx, Kind, Node, RESERVED_COLUMNS, Rejection, SchemaOptions, accepts, describe,
    list_hint, merge_value, prim, push_path, struct_hint, type_name, value_desc,
};
use crate::record::json::{Arr, Obj, Value};
use crate::record::values::timestamp_shape;

/// The columns a record would add, by Iceberg full name.
#[derive(Debug, Default)]
pub(super) struct Fresh {
    names: Vec<String>,
}

impl Fresh {
    pub(super) fn is_empty(&self) -> bool {
        self.names.is_empty()
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

/// Where the walk is: dotted path for messages and overrides, Iceberg full name for the
/// uniqueness check, depth for the limit.
struct Walk<'a> {
    options: &'a SchemaOptions,
    path: String,
    full: String,
    depth: usize,
    /// Inside a value whose columns are already being counted.
    in_fresh: bool,
    fresh: Fresh,
}

impl Walk<'_> {
    fn enter(&mut self) -> Result<(), Rejection> {
        self.depth += 1;
        if self.depth > self.options.max_depth {
            return Err(Rejection::TooDeep {
                path: self.path.clone(),
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
            path: self.path.clone(),
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
        path: String::new(),
        full: String::new(),
        depth: 0,
        in_fresh: false,
        fresh: Fresh::default(),
    };
    check_object(fields, record, hints, &mut walk, true)?;
    Ok(walk.fresh)
}

fn check_object(
    fields: &IndexMap<String, Node>,
    record: Obj<'_>,
    hints: Option<&StructType>,
    walk: &mut Walk<'_>,
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
        let len = push_path(&mut walk.path, &name);
        let full_len = push_path(&mut walk.full, &name);
        match fields.get(name.as_ref()) {
            Some(node) => check_value(node, value, hint, walk)?,
            None => fresh(value, hint, walk)?,
        }
        walk.path.truncate(len);
        walk.full.truncate(full_len);
    }
    Ok(())
}

/// A value of a field that has no type yet: valid on its own, and the columns it would
/// add are noted (by learning it on a scratch node).
fn fresh(v: Value<'_>, hint: Option<&Type>, walk: &mut Walk<'_>) -> Result<(), Rejection> {
    if v.is_null() {
        return Ok(());
    }
    let outer = walk.in_fresh;
    walk.in_fresh = true;
    let valid = validate_fresh(v, walk);
    walk.in_fresh = outer;
    valid?;
    if !outer {
        let mut ctx = Ctx {
            options: walk.options,
            path: walk.path.clone(),
            changed: false,
        };
        let node = Node::create(v, hint, &mut ctx);
        node_names(&node, &mut walk.full, &mut walk.fresh.names);
    }
    Ok(())
}

/// A new value must fit its override, and the items of each array must agree with
/// each other.
fn validate_fresh(v: Value<'_>, walk: &mut Walk<'_>) -> Result<(), Rejection> {
    if let Some(t) = walk.options.overrides.get(walk.path.as_str()) {
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
                let len = push_path(&mut walk.path, &key.get());
                validate_fresh(child, walk)?;
                walk.path.truncate(len);
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
fn check_items(
    element: &Node,
    items: Arr<'_>,
    hint: Option<&Type>,
    walk: &mut Walk<'_>,
) -> Result<(), Rejection> {
    let full_len = push_path(&mut walk.full, "element");
    // A committed primitive element cannot learn: no copy needed.
    let settled = element.locked
        && !matches!(
            element.kind,
            None | Some(Kind::Struct(_)) | Some(Kind::List(_))
        );
    let mut learnt: Option<Node> = None;
    let mut ctx = Ctx {
        options: walk.options,
        path: walk.path.clone(),
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
    walk.full.truncate(full_len);
    Ok(())
}

fn check_value(
    node: &Node,
    v: Value<'_>,
    hint: Option<&Type>,
    walk: &mut Walk<'_>,
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
