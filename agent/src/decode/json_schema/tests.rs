use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const ADDRESS: &str = r#"{
  "type": "object",
  "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
  "required": ["street"],
  "$defs": {"Country": {"type": "string", "enum": ["DE", "FR"]}}
}"#;

const ORDER: &str = r##"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Order",
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "amount": {"type": "number"},
    "paid": {"type": "boolean"},
    "customer": {"type": "string"},
    "placed_at": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"},
    "ref": {"type": "string", "format": "uuid"},
    "note": {"oneOf": [{"type": "null", "title": "Not included"}, {"type": "string"}]},
    "maybe": {"type": ["null", "integer"]},
    "mixed": {"type": ["string", "integer"]},
    "anything": {},
    "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
    "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
    "address": {"$ref": "address.json"},
    "country": {"$ref": "address.json#/$defs/Country"},
    "tree": {"$ref": "#/definitions/Tree"},
    "nothing": {"type": "null"}
  },
  "required": ["id"],
  "definitions": {
    "Line": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}},
    "Tree": {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/definitions/Tree"}}}}
  }
}"##;

fn schema() -> JsonSchemaDoc {
    JsonSchemaDoc::parse(
        Some(3),
        ORDER,
        &[("address.json".to_string(), ADDRESS.to_string())],
    )
    .unwrap()
}

fn decode(schema: &JsonSchemaDoc, v: &Value, validate: bool) -> Result<Value, DecodeError> {
    let mut out = Vec::new();
    schema.decode(v.to_string().as_bytes(), validate, &mut out)?;
    Ok(serde_json::from_slice(&out).unwrap())
}

#[test]
fn every_json_schema_type_maps_to_its_iceberg_type() {
    let schema = schema();
    crate::decode::assert_columns(
        &schema.columns,
        &[
            ("id", "long"),
            ("amount", "double"),
            ("paid", "boolean"),
            ("customer", "string"),
            ("placed_at", "timestamptz"),
            ("day", "date"),
            ("ref", "uuid"),
            ("note", "string"),
            ("maybe", "long"),
            ("mixed", "string"),
            ("anything", "string"),
            ("lines", "list<struct<sku: string, qty: long>>"),
            ("attrs", "map<string, long>"),
            ("address", "struct<street: string, zip: string>"),
            ("country", "string"),
            ("tree", "struct<name: string, children: list<string>>"),
        ],
        "`nothing` (null) has no column",
    );
}

#[test]
fn values_are_written_in_their_canonical_form() {
    let schema = schema();
    let got = decode(
        &schema,
        &json!({
            "id": 7.0, "amount": 2, "paid": true, "customer": "c",
            "placed_at": "2024-01-02T05:04:05.123456789+02:00", "day": "2024-01-02",
            "ref": "5F0C6F2E-8D7A-4A1B-9C3E-0B1D2E3F4A5B", "note": null, "maybe": 3,
            "mixed": 5, "anything": {"a": [1]}, "lines": [{"sku": "s", "qty": 1}],
            "attrs": {"x": 1}, "address": {"street": "Main"}, "country": "DE",
            "tree": {"name": "root", "children": [{"name": "leaf"}]},
            "extra": {"not": "declared"}
        }),
        true,
    )
    .unwrap();
    assert_eq!(
        got,
        json!({
            "id": 7, "amount": 2, "paid": true, "customer": "c",
            "placed_at": "2024-01-02T03:04:05.123456Z", "day": "2024-01-02",
            "ref": "5f0c6f2e-8d7a-4a1b-9c3e-0b1d2e3f4a5b", "note": null, "maybe": 3,
            "mixed": "5", "anything": "{\"a\":[1]}", "lines": [{"sku": "s", "qty": 1}],
            "attrs": {"x": 1}, "address": {"street": "Main"}, "country": "DE",
            "tree": {"name": "root", "children": ["{\"name\":\"leaf\"}"]},
            "extra": {"not": "declared"}
        })
    );
}

#[test]
fn violations_name_the_place_and_follow_the_policy() {
    let schema = schema();
    let e = decode(&schema, &json!({"id": "x"}), true).unwrap_err();
    let text = e.to_string();
    assert_eq!(
        text,
        r#"value does not match its JSON schema (id 3): at /id: value is not of type "integer""#
    );
    assert!(!e.stops_pipeline());
    // The referenced schema is enforced too.
    let e = decode(&schema, &json!({"id": 1, "address": {"zip": "1"}}), true).unwrap_err();
    assert!(e.to_string().contains("street"), "{e}");
    // A date-time that is not one: draft 7 asserts formats; later drafts do not, and
    // then the writer refuses it.
    let e = decode(&schema, &json!({"id": 1, "placed_at": "yesterday"}), true).unwrap_err();
    assert!(
        e.to_string()
            .contains("at /placed_at: value is not a \"date-time\""),
        "{e}"
    );
    let lax = JsonSchemaDoc::parse(
        None,
        r#"{"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}"#,
        &[],
    )
    .unwrap();
    let e = decode(&lax, &json!({"at": "yesterday"}), true).unwrap_err();
    assert!(
        e.to_string()
            .contains("at /at: \"yesterday\" is not a valid date-time"),
        "{e}"
    );
    // Under `coerce` the value is written as it is, for the schema stage to check.
    assert_eq!(
        decode(
            &schema,
            &json!({"id": "x", "placed_at": "yesterday"}),
            false
        )
        .unwrap(),
        json!({"id": "x", "placed_at": "yesterday"})
    );
    assert!(matches!(
        schema.decode(b"{bad", true, &mut Vec::new()),
        Err(DecodeError::NotJson(_))
    ));
}

#[test]
fn keys_can_be_any_value() {
    let key = JsonSchemaDoc::parse(Some(4), r#"{"type": "string"}"#, &[]).unwrap();
    assert!(!key.is_object());
    assert!(key.columns.fields().is_empty());
    assert_eq!(key.decode_key(br#""k1""#, true).unwrap(), "k1");
    assert!(key.decode_key(b"1", true).is_err());
    let key = JsonSchemaDoc::parse(
        Some(5),
        r#"{"type": "object", "properties": {"id": {"type": "integer"}}}"#,
        &[],
    )
    .unwrap();
    assert_eq!(
        key.decode_key(br#"{"id": 1}"#, true).unwrap(),
        r#"{"id":1}"#
    );
}

#[test]
fn unusable_schemas_are_rejected_with_the_reason() {
    let e = JsonSchemaDoc::parse(Some(6), "{not json", &[]).unwrap_err();
    assert!(
        e.to_string().contains("writer schema id 6: not JSON"),
        "{e}"
    );
    let e = JsonSchemaDoc::parse(Some(6), r#"{"type": 5}"#, &[]).unwrap_err();
    assert!(e.to_string().contains("not a usable JSON schema"), "{e}");
    // A reference the registry did not give.
    let e = JsonSchemaDoc::parse(Some(6), ORDER, &[]).unwrap_err();
    assert!(e.to_string().contains("address.json"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Fuzz: JSON-like text never panics the validator or the writer.
    #[test]
    fn fuzz_json_schema_decoder_never_panics(text in r#"[{}\[\]":,0-9a-z. -]{0,64}"#) {
        let schema = schema();
        let _ = schema.decode(text.as_bytes(), true, &mut Vec::new());
        let _ = schema.decode(text.as_bytes(), false, &mut Vec::new());
    }
}
