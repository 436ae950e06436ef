//! JSON Schema -> Iceberg types (the table in `docs/types.md`), and the plan that writes
//! a validated instance as JSON text of exactly those types.
//!
//! `$ref`s are followed within the schema (`#/definitions/X`, `#/$defs/X`) and into the
//! schemas of registry references (`address.json`, `address.json#/$defs/Street`). A
//! `$ref` back into a schema being mapped (a recursive type) becomes a `string` column
//! holding the JSON text of that part.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};
use serde_json::Value;

/// Why a JSON schema cannot be mapped to columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonSchemaMappingError {
    /// Subschemas nested too deep to follow.
    #[error("schema nested deeper than 64 levels")]
    TooDeep,
    /// A `$ref` to a document that is not among the schema's references.
    #[error("$ref `{reference}` names no schema reference (known: {known})")]
    UnknownReference {
        /// The `$ref` value.
        reference: String,
        /// The reference names there are, comma-separated.
        known: String,
    },
    /// A `$ref` whose JSON pointer finds nothing in its document.
    #[error("$ref `{0}` points to nothing")]
    Dangling(String),
}

/// How one value is written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// Written as it is; the column type.
    Pass(PrimitiveType),
    /// `integer`: `long`; an integral float (`1.0`) is written as an integer.
    Long,
    /// `string` with `format: date-time`: normalized to UTC with `Z`.
    Timestamptz,
    /// `string` with `format: date`.
    Date,
    /// `string` with `format: uuid`: canonical lowercase hyphenated form.
    Uuid,
    /// Several kinds, or anything (`{}`, free-form objects, tuples, recursion): a `string`
    /// column; strings as they are, other values as their JSON text.
    JsonText,
    /// `object` with `properties`: a struct. Properties the schema does not declare are
    /// written as they are and typed by inference, like plain JSON.
    Object(Vec<Property>),
    /// `array` with `items`.
    List(Box<Plan>),
    /// `object` with only `additionalProperties` (or `patternProperties`): `map<string, V>`.
    Map(Box<Plan>),
    /// `null` only: no column.
    Nothing,
}

/// One declared property.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Property {
    pub(crate) name: String,
    pub(crate) plan: Plan,
}

impl Plan {
    /// The Iceberg type of a value of this plan (`None`: no column).
    pub(crate) fn iceberg_type(&self) -> Option<Type> {
        use PrimitiveType as P;
        Some(match self {
            Plan::Pass(p) => Type::Primitive(p.clone()),
            Plan::Long => Type::Primitive(P::Long),
            Plan::Timestamptz => Type::Primitive(P::Timestamptz),
            Plan::Date => Type::Primitive(P::Date),
            Plan::Uuid => Type::Primitive(P::Uuid),
            Plan::JsonText => Type::Primitive(P::String),
            Plan::Object(props) => {
                let s = struct_of(props);
                if s.fields().is_empty() {
                    return None;
                }
                Type::Struct(s)
            }
            Plan::List(item) => Type::List(ListType::new(Arc::new(NestedField::list_element(
                0,
                item.iceberg_type()?,
                false,
            )))),
            Plan::Map(value) => Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(0, Type::Primitive(P::String))),
                Arc::new(NestedField::map_value_element(
                    0,
                    value.iceberg_type()?,
                    false,
                )),
            )),
            Plan::Nothing => return None,
        })
    }
}

/// The struct of declared properties (those with a column).
pub(crate) fn struct_of(props: &[Property]) -> StructType {
    StructType::new(
        props
            .iter()
            .filter_map(|p| {
                p.plan
                    .iceberg_type()
                    .map(|t| Arc::new(NestedField::optional(0, p.name.clone(), t)))
            })
            .collect(),
    )
}

/// The schema documents a plan is built from: the root and the referenced schemas by
/// reference name.
pub(crate) struct Docs<'a> {
    pub(crate) root: &'a Value,
    pub(crate) references: &'a HashMap<String, Value>,
}

/// Where a subschema lives: a document (`None` = root) and a JSON pointer in it.
type Location = (Option<String>, String);

impl Docs<'_> {
    /// The plan of the root schema.
    pub(crate) fn plan(&self) -> Result<Plan, JsonSchemaMappingError> {
        let mut stack = Vec::new();
        self.plan_of(self.root, &None, &mut stack, 0)
    }

    fn doc(&self, name: &Option<String>) -> Option<&Value> {
        match name {
            None => Some(self.root),
            Some(n) => self.references.get(n),
        }
    }

    /// Resolves a `$ref` seen in document `doc`.
    fn resolve(
        &self,
        doc: &Option<String>,
        reference: &str,
    ) -> Result<(Location, &Value), JsonSchemaMappingError> {
        let (file, fragment) = reference.split_once('#').unwrap_or((reference, ""));
        let file = file.strip_prefix("json-schema:///").unwrap_or(file);
        let target_doc = if file.is_empty() {
            doc.clone()
        } else if self.references.contains_key(file) {
            Some(file.to_string())
        } else {
            return Err(JsonSchemaMappingError::UnknownReference {
                reference: reference.to_string(),
                known: self
                    .references
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let pointer = percent_decode(fragment);
        let value = self
            .doc(&target_doc)
            .and_then(|d| d.pointer(&pointer))
            .ok_or_else(|| JsonSchemaMappingError::Dangling(reference.to_string()))?;
        Ok(((target_doc, pointer), value))
    }

    fn plan_of(
        &self,
        schema: &Value,
        doc: &Option<String>,
        stack: &mut Vec<Location>,
        depth: usize,
    ) -> Result<Plan, JsonSchemaMappingError> {
        if depth > 64 {
            return Err(JsonSchemaMappingError::TooDeep);
        }
        let Value::Object(s) = schema else {
            // `true` or `{}`-like booleans: anything.
            return Ok(if schema == &Value::Bool(false) {
                Plan::Nothing
            } else {
                Plan::JsonText
            });
        };
        if let Some(Value::String(reference)) = s.get("$ref") {
            let (location, target) = self.resolve(doc, reference)?;
            if stack.contains(&location) {
                return Ok(Plan::JsonText);
            }
            stack.push(location.clone());
            let plan = self.plan_of(target, &location.0, stack, depth + 1);
            stack.pop();
            return plan;
        }
        // Alternatives: null branches make a field optional, which every column is.
        for key in ["oneOf", "anyOf"] {
            if let Some(Value::Array(branches)) = s.get(key) {
                let mut plans = Vec::new();
                for b in branches {
                    let p = self.plan_of(b, doc, stack, depth + 1)?;
                    if p != Plan::Nothing && !plans.contains(&p) {
                        plans.push(p);
                    }
                }
                return Ok(match plans.len() {
                    0 => Plan::Nothing,
                    1 => plans.pop().expect("one plan"),
                    _ => Plan::JsonText,
                });
            }
        }
        if let Some(Value::Array(parts)) = s.get("allOf") {
            // Object parts merge their properties; otherwise the first typed part wins.
            let mut props: Vec<Property> = Vec::new();
            let mut other = None;
            for part in parts {
                match self.plan_of(part, doc, stack, depth + 1)? {
                    Plan::Object(more) => {
                        for p in more {
                            if !props.iter().any(|q| q.name == p.name) {
                                props.push(p);
                            }
                        }
                    }
                    Plan::Nothing | Plan::JsonText => {}
                    p => other = other.or(Some(p)),
                }
            }
            // Sibling keywords (`properties` next to `allOf`) count too.
            if let Plan::Object(more) = self.typed(s, doc, stack, depth)? {
                props.extend(more);
            }
            return Ok(match other {
                Some(p) if props.is_empty() => p,
                _ if !props.is_empty() => Plan::Object(props),
                _ => Plan::JsonText,
            });
        }
        self.typed(s, doc, stack, depth)
    }

    /// The plan from `type` (and `format`, `properties`, `items`, `enum`, `const`).
    fn typed(
        &self,
        s: &serde_json::Map<String, Value>,
        doc: &Option<String>,
        stack: &mut Vec<Location>,
        depth: usize,
    ) -> Result<Plan, JsonSchemaMappingError> {
        let mut types: Vec<&str> = match s.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => {
                // No type: guess it from the other keywords.
                if s.contains_key("properties") || s.contains_key("additionalProperties") {
                    vec!["object"]
                } else if s.contains_key("items") {
                    vec!["array"]
                } else if let Some(values) = s.get("enum").and_then(Value::as_array) {
                    kinds_of(values)
                } else if let Some(v) = s.get("const") {
                    kinds_of(std::slice::from_ref(v))
                } else {
                    Vec::new()
                }
            }
        };
        types.retain(|t| *t != "null");
        // `integer` and `number` together are a number.
        if types.contains(&"number") {
            types.retain(|t| *t != "integer");
        }
        let [kind] = types.as_slice() else {
            return Ok(if types.is_empty() && s.get("type").is_some() {
                Plan::Nothing
            } else {
                Plan::JsonText
            });
        };
        Ok(match *kind {
            "boolean" => Plan::Pass(PrimitiveType::Boolean),
            "integer" => Plan::Long,
            "number" => Plan::Pass(PrimitiveType::Double),
            "string" => match s.get("format").and_then(Value::as_str) {
                Some("date-time") => Plan::Timestamptz,
                Some("date") => Plan::Date,
                Some("uuid") => Plan::Uuid,
                _ => Plan::Pass(PrimitiveType::String),
            },
            "array" => match s.get("items") {
                Some(items @ (Value::Object(_) | Value::Bool(true))) => {
                    Plan::List(Box::new(self.plan_of(items, doc, stack, depth + 1)?))
                }
                // Tuples (`items` as an array, `prefixItems`) and untyped arrays.
                _ => Plan::JsonText,
            },
            "object" => {
                let props = match s.get("properties") {
                    Some(Value::Object(props)) => props,
                    _ => {
                        return Ok(match s.get("additionalProperties") {
                            Some(v @ Value::Object(_)) => {
                                Plan::Map(Box::new(self.plan_of(v, doc, stack, depth + 1)?))
                            }
                            _ => Plan::JsonText,
                        });
                    }
                };
                let mut out = Vec::with_capacity(props.len());
                for (name, sub) in props {
                    out.push(Property {
                        name: name.clone(),
                        plan: self.plan_of(sub, doc, stack, depth + 1)?,
                    });
                }
                Plan::Object(out)
            }
            _ => Plan::JsonText,
        })
    }
}

/// The JSON kinds of `enum` / `const` values, as `type` names.
fn kinds_of(values: &[Value]) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    for v in values {
        let k = match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_f64() => "number",
            Value::Number(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds
}

/// `%25` -> `%` etc. in a URI fragment (JSON pointers in `$ref`s may be percent-encoded).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
