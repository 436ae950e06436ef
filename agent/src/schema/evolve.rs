//! Declared schemas merged into the tracker, and the complete next table schema.

use std::sync::Arc;

use iceberg::spec::{
    ListType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type,
};
use indexmap::IndexMap;

use super::{Kind, Node, RESERVED_COLUMNS, SchemaError, SchemaTracker, renumber};

/// The type a declared type widens `current` to, if it is a safe widening:
/// int -> long, float -> double, decimal(P,S) -> decimal(P2,S) with P2 > P.
pub fn widening(current: &Type, declared: &Type) -> Option<Type> {
    use PrimitiveType as P;
    let (Type::Primitive(c), Type::Primitive(d)) = (current, declared) else {
        return None;
    };
    match (c, d) {
        (P::Int, P::Long) | (P::Float, P::Double) => Some(declared.clone()),
        (
            P::Decimal {
                precision: p1,
                scale: s1,
            },
            P::Decimal {
                precision: p2,
                scale: s2,
            },
        ) if s1 == s2 && p2 > p1 => Some(declared.clone()),
        _ => None,
    }
}

/// The wider of two widenings of one column (a later declaration never narrows an
/// earlier one: values may already have been accepted for the wider type).
pub fn widest(a: Option<Type>, b: Option<Type>) -> Option<Type> {
    match (a, b) {
        (Some(a), Some(b)) if widening(&a, &b).is_some() => Some(b),
        (a, b) => a.or(b),
    }
}

/// The Iceberg type a node currently stands for (the committed one for locked nodes).
fn node_type(node: &Node) -> Option<Type> {
    node.iceberg_type()
}

pub(super) fn declare_fields(fields: &mut IndexMap<String, Node>, declared: &StructType) {
    for f in declared.fields() {
        match fields.get_mut(&f.name) {
            None => {
                fields.insert(f.name.clone(), Node::from_type(&f.field_type, false));
            }
            Some(node) => declare_node(node, &f.field_type),
        }
    }
}

fn declare_node(node: &mut Node, declared: &Type) {
    match (&mut node.kind, declared) {
        (None, t) => {
            let locked = node.locked;
            *node = Node::from_type(t, false);
            node.locked = locked;
        }
        (Some(Kind::Struct(children)), Type::Struct(st)) => declare_fields(children, st),
        (Some(Kind::List(element)), Type::List(l)) => {
            declare_node(element, &l.element_field.field_type)
        }
        (Some(_), t) => {
            let Some(current) = node_type(node) else {
                return;
            };
            if same_type(&current, t) {
                // Same type: from now on it is declared and no longer widens by inference.
                node.declared = true;
                return;
            }
            let Some(wider) = widening(&current, t) else {
                return;
            };
            if node.locked {
                // Widening a committed column needs a schema commit: evolved_schema.
                node.widen = widest(node.widen.take(), Some(wider));
            } else {
                let locked = node.locked;
                *node = Node::from_type(&wider, false);
                node.locked = locked;
            }
        }
    }
}

impl SchemaTracker {
    /// The complete next table schema, or `None` when the records seen need no change.
    ///
    /// Existing field ids are unchanged; new fields (also nested in structs and list
    /// elements) get ids above `last_column_id`; declared safe widenings are applied
    /// (int -> long, float -> double, decimal precision increase); identifier field ids
    /// are preserved. Columns the records no longer carry stay (they read as null).
    pub fn evolved_schema(
        &self,
        current: &Schema,
        last_column_id: i32,
    ) -> Result<Option<Schema>, SchemaError> {
        let mut next_id = last_column_id;
        let mut id = || {
            next_id += 1;
            next_id
        };
        let mut changed = false;
        let fields = evolve_struct(current.as_struct(), &self.root, true, &mut id, &mut changed);
        if !changed {
            return Ok(None);
        }
        let schema = Schema::builder()
            .with_schema_id(current.schema_id() + 1)
            .with_identifier_field_ids(current.identifier_field_ids())
            .with_fields(fields)
            .build()?;
        Ok(Some(schema))
    }
}

impl SchemaTracker {
    /// The first column whose buffered values a table of schema `table` cannot hold
    /// without loss, as `path: ours vs the table's`; `None` when every column fits.
    ///
    /// Rows are admitted against the tracker's types. When another writer has given a
    /// column another type since (or added one the tracker also learned, differently),
    /// writing would cast the values and turn what does not convert into nulls. A column
    /// fits when the types are equal or the table's is a widening of ours: int -> long,
    /// float -> double, a wider decimal, and for a column not committed yet the widenings
    /// inference itself makes (long -> double, timestamp -> string).
    pub fn conflict_with(&self, table: &Schema) -> Option<String> {
        conflict_in_struct(table.as_struct(), &self.root, "", true)
    }
}

fn conflict_in_struct(
    table: &StructType,
    nodes: &IndexMap<String, Node>,
    parent: &str,
    top: bool,
) -> Option<String> {
    for (name, node) in nodes {
        if top && RESERVED_COLUMNS.contains(&name.as_str()) {
            continue;
        }
        let Some(field) = table.field_by_name(name) else {
            continue;
        };
        let path = if parent.is_empty() {
            name.clone()
        } else {
            format!("{parent}.{name}")
        };
        if let Some(c) = conflict_in_type(&field.field_type, node, &path) {
            return Some(c);
        }
    }
    None
}

fn conflict_in_type(table: &Type, node: &Node, path: &str) -> Option<String> {
    let ours = match (&node.kind, table) {
        (None, _) => return None,
        (Some(Kind::Struct(children)), Type::Struct(st)) => {
            return conflict_in_struct(st, children, path, false);
        }
        (Some(Kind::List(element)), Type::List(l)) => {
            return conflict_in_type(&l.element_field.field_type, element, &format!("{path}[]"));
        }
        (Some(_), _) if node.widen.is_some() => {
            // A declared widening this commit applies to the table's column.
            let wider = node.widen.clone()?;
            if same_type(table, &wider) || widening(table, &wider).is_some() {
                return None;
            }
            wider
        }
        _ => node_type(node)?,
    };
    if fits(&ours, table, node.locked) {
        return None;
    }
    Some(format!(
        "`{path}`: {} in the buffered rows, {} in the table",
        super::type_name(&ours),
        super::type_name(table)
    ))
}

/// Whether two types are the same Iceberg type. Field ids are not part of a type: a map,
/// list or struct that a decoder declares carries the decoder's ids, and the table's
/// copy of it the ids the table assigned.
fn same_type(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Primitive(a), Type::Primitive(b)) => a == b,
        (Type::List(a), Type::List(b)) => {
            same_type(&a.element_field.field_type, &b.element_field.field_type)
        }
        (Type::Map(a), Type::Map(b)) => {
            same_type(&a.key_field.field_type, &b.key_field.field_type)
                && same_type(&a.value_field.field_type, &b.value_field.field_type)
        }
        (Type::Struct(a), Type::Struct(b)) => {
            a.fields().len() == b.fields().len()
                && a.fields()
                    .iter()
                    .zip(b.fields())
                    .all(|(x, y)| x.name == y.name && same_type(&x.field_type, &y.field_type))
        }
        _ => false,
    }
}

/// Whether values buffered as `ours` convert to `table` without loss.
fn fits(ours: &Type, table: &Type, committed: bool) -> bool {
    use PrimitiveType as P;
    if same_type(ours, table) || widening(ours, table).is_some() {
        return true;
    }
    if committed {
        return false;
    }
    matches!(
        (ours, table),
        (Type::Primitive(P::Long), Type::Primitive(P::Double))
            | (
                Type::Primitive(P::Timestamp | P::Timestamptz),
                Type::Primitive(P::String)
            )
    )
}

fn evolve_struct(
    current: &StructType,
    nodes: &IndexMap<String, Node>,
    top: bool,
    id: &mut impl FnMut() -> i32,
    changed: &mut bool,
) -> Vec<NestedFieldRef> {
    let mut out: Vec<NestedFieldRef> = current
        .fields()
        .iter()
        .map(|f| match nodes.get(&f.name) {
            Some(node) if !(top && RESERVED_COLUMNS.contains(&f.name.as_str())) => {
                match evolve_type(&f.field_type, node, id, changed) {
                    Some(t) => {
                        let mut field = (**f).clone();
                        field.field_type = Box::new(t);
                        Arc::new(field)
                    }
                    None => f.clone(),
                }
            }
            _ => f.clone(),
        })
        .collect();
    for (name, node) in nodes {
        if current.field_by_name(name).is_some()
            || (top && RESERVED_COLUMNS.contains(&name.as_str()))
        {
            continue;
        }
        if let Some(t) = node.iceberg_type() {
            *changed = true;
            let field_id = id();
            out.push(Arc::new(NestedField::optional(
                field_id,
                name.clone(),
                renumber(&t, id),
            )));
        }
    }
    out
}

/// The new type of a field, or `None` if it stays as it is.
fn evolve_type(
    current: &Type,
    node: &Node,
    id: &mut impl FnMut() -> i32,
    changed: &mut bool,
) -> Option<Type> {
    match (current, &node.kind) {
        (Type::Struct(st), Some(Kind::Struct(children))) => {
            let mut inner = false;
            let fields = evolve_struct(st, children, false, id, &mut inner);
            inner.then(|| {
                *changed = true;
                Type::Struct(StructType::new(fields))
            })
        }
        (Type::List(l), Some(Kind::List(element))) => {
            let t = evolve_type(&l.element_field.field_type, element, id, changed)?;
            let mut field = (*l.element_field).clone();
            field.field_type = Box::new(t);
            Some(Type::List(ListType::new(Arc::new(field))))
        }
        (Type::Primitive(_), _) => {
            let wider = node.widen.clone()?;
            *changed = true;
            Some(wider)
        }
        _ => None,
    }
}
