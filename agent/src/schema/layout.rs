//! The shape of the known columns: their Iceberg full names (unique in a schema) and
//! the types rows are buffered in.

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::spec::{ListType, NestedField, PrimitiveType, StructType, Type};
use indexmap::IndexMap;

use super::{Kind, Node, RESERVED_COLUMNS, push_full};

/// Full names of the known columns, rebuilt when the tracker's version moves.
#[derive(Debug, Clone, Default)]
pub(super) struct NameCache {
    version: Option<u64>,
    names: HashSet<String>,
}

impl NameCache {
    pub(super) fn refresh(&mut self, root: &IndexMap<String, Node>, version: u64) {
        if self.version == Some(version) {
            return;
        }
        let mut names = Vec::new();
        let mut full = String::new();
        for (name, node) in root {
            let len = push_full(&mut full, name, true);
            node_names(node, &mut full, &mut names);
            full.truncate(len);
        }
        self.names = names.into_iter().collect();
        self.version = Some(version);
    }

    pub(super) fn count(&self) -> usize {
        self.names.len()
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Appends the full names of `node` (named `full`) and its nested columns, if it is a
/// column at all.
pub(super) fn node_names(node: &Node, full: &mut String, out: &mut Vec<String>) {
    if !node.is_known() {
        return;
    }
    out.push(full.clone());
    match &node.kind {
        Some(Kind::Struct(children)) => {
            for (name, child) in children {
                let len = push_full(full, name, false);
                node_names(child, full, out);
                full.truncate(len);
            }
        }
        Some(Kind::List(element)) => {
            let len = push_full(full, "element", false);
            node_names(element, full, out);
            full.truncate(len);
        }
        Some(Kind::Other(t)) => type_names(t, full, out),
        _ => {}
    }
}

/// Nested names inside a declared type.
fn type_names(t: &Type, full: &mut String, out: &mut Vec<String>) {
    let child = |name: &str, t: &Type, full: &mut String, out: &mut Vec<String>| {
        let len = push_full(full, name, false);
        out.push(full.clone());
        type_names(t, full, out);
        full.truncate(len);
    };
    match t {
        Type::Struct(s) => {
            for f in s.fields() {
                child(&f.name, &f.field_type, full, out);
            }
        }
        Type::List(l) => child("element", &l.element_field.field_type, full, out),
        Type::Map(m) => {
            child("key", &m.key_field.field_type, full, out);
            child("value", &m.value_field.field_type, full, out);
        }
        Type::Primitive(_) => {}
    }
}

/// See [`super::SchemaTracker::buffer_type`].
pub(super) fn buffer_type(root: &IndexMap<String, Node>) -> StructType {
    StructType::new(
        root.iter()
            .filter(|(name, _)| !RESERVED_COLUMNS.contains(&name.as_str()))
            .filter_map(|(name, node)| {
                buffered(node).map(|t| Arc::new(NestedField::optional(0, name.clone(), t)))
            })
            .collect(),
    )
}

fn buffered(node: &Node) -> Option<Type> {
    if !node.is_known() {
        return None;
    }
    Some(match node.kind.as_ref()? {
        // The type may still become string: keep the text until the buffer is written.
        Kind::Timestamptz | Kind::Timestamp if !node.fixed() => {
            Type::Primitive(PrimitiveType::String)
        }
        Kind::Struct(fields) => Type::Struct(StructType::new(
            fields
                .iter()
                .filter_map(|(name, n)| {
                    buffered(n).map(|t| Arc::new(NestedField::optional(0, name.clone(), t)))
                })
                .collect(),
        )),
        Kind::List(element) => Type::List(ListType::new(Arc::new(NestedField::list_element(
            0,
            buffered(element)?,
            false,
        )))),
        // A pending declared widening: values may already need the wider type.
        Kind::Other(_) if node.widen.is_some() => node.widen.clone()?,
        _ => node.iceberg_type()?,
    })
}
