//! The configuration reference (`docs/configuration.md`) checked against the config
//! structs both ways, so neither can drift: every key its example shows parses (its
//! commented-out keys uncommented), and its "Every key" tables list exactly the keys
//! of every section, each with a type and a default.

use serde::de::{self, Deserialize, Visitor};

use super::Config;

/// A deserializer that only answers which fields a struct accepts (serde's derive
/// passes them to `deserialize_struct`), in its error.
struct FieldNames;

impl<'de> de::Deserializer<'de> for FieldNames {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom(""))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom(fields.join(",")))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The keys a config struct accepts.
fn fields_of<T: for<'de> Deserialize<'de>>() -> Vec<String> {
    match T::deserialize(FieldNames) {
        Err(e) => e
            .to_string()
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect(),
        Ok(_) => Vec::new(),
    }
}

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The TOML block of the reference with every commented-out key and section
/// uncommented (lines like `# key = value` and `# [section]`; prose stays a comment).
fn reference_with_every_key() -> String {
    let text = doc("configuration.md");
    let block = text
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the reference has a toml block");
    block
        .lines()
        .map(|line| {
            let Some(rest) = line.strip_prefix("# ") else {
                return line.to_string();
            };
            let key = rest.split(['=', ' ']).next().unwrap_or("");
            let is_key = rest.contains(" = ")
                && !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.\"-".contains(c));
            let is_section = rest.starts_with('[');
            if is_key || is_section {
                rest.to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_key_the_reference_shows_parses() {
    let text = reference_with_every_key();
    let problems = match Config::parse(&text, &|_| Some("x".into())) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.0,
    };
    // Settings that do not fit together or name files that do not exist are the
    // example's business; a key or a type the structs do not know is drift.
    let drift: Vec<_> = problems
        .iter()
        .filter(|e| {
            [
                "unknown key",
                "invalid type",
                "unknown variant",
                "not valid TOML",
            ]
            .iter()
            .any(|m| e.message.contains(m))
        })
        .collect();
    assert!(drift.is_empty(), "{drift:#?}\n--- parsed:\n{text}");
}

/// The keys of catalog variant `kind` (`type = "kind"`), from the error for a key it
/// does not accept (serde lists the ones it does).
fn catalog_fields(kind: &str) -> Vec<String> {
    let text = format!("type = \"{kind}\"\nnot_a_key = 0\n");
    let error = match toml::from_str::<floe_iceberg::CatalogConfig>(&text) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a {kind} catalog accepted an unknown key"),
    };
    let expected = error
        .split_once("expected")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("{kind}: no list of keys in {error:?}"));
    let mut fields = vec!["type".to_string()];
    fields.extend(expected.split('`').skip(1).step_by(2).map(str::to_string));
    fields
}

/// One table of "Every key": its heading and, per row, key, type and default.
struct KeyTable {
    heading: String,
    rows: Vec<[String; 3]>,
}

/// The tables under `## Every key` of `docs/configuration.md`, by `###` heading.
fn key_tables() -> Vec<KeyTable> {
    let text = doc("configuration.md");
    let section = text
        .split("\n## Every key\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/configuration.md has a section \"## Every key\"");
    let mut tables: Vec<KeyTable> = Vec::new();
    for line in section.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            tables.push(KeyTable {
                heading: heading.to_string(),
                rows: Vec::new(),
            });
            continue;
        }
        let Some(row) = line.strip_prefix('|') else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells
            .first()
            .is_some_and(|c| *c == "key" || c.starts_with("---"))
        {
            continue;
        }
        let table = tables
            .last_mut()
            .unwrap_or_else(|| panic!("a table row before any ### heading: {line}"));
        // Four cells and the empty one after the closing `|`.
        assert_eq!(
            cells.len(),
            5,
            "{}: a row needs key, type, default and meaning (no `|` inside cells): {line}",
            table.heading
        );
        let key = cells[0]
            .strip_prefix('`')
            .and_then(|k| k.strip_suffix('`'))
            .unwrap_or_else(|| panic!("{}: key not in backticks: {line}", table.heading));
        table
            .rows
            .push([key.to_string(), cells[1].to_string(), cells[2].to_string()]);
    }
    tables
}

#[test]
fn every_key_of_every_section_is_documented_with_type_and_default() {
    let to_strings = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let sections: Vec<(&str, Vec<String>)> = vec![
        ("`[agent]`", fields_of::<super::AgentConfig>()),
        (
            "`[metrics]`",
            fields_of::<crate::telemetry::MetricsConfig>(),
        ),
        (
            "`[plugins]`",
            fields_of::<crate::transform::PluginsConfig>(),
        ),
        (
            "`[catalogs.NAME]` with `type = \"embedded\"`",
            catalog_fields("embedded"),
        ),
        (
            "`[catalogs.NAME]` with `type = \"sql\"`",
            catalog_fields("sql"),
        ),
        ("`[catalogs.NAME]` with `type = \"rest\"`", {
            let mut f = vec!["type".to_string()];
            f.extend(fields_of::<floe_iceberg::rest::RestCatalogConfig>());
            f
        }),
        ("`s3.*`", fields_of::<floe_iceberg::rest::S3Settings>()),
        ("`aws.*`", fields_of::<floe_iceberg::aws::AwsSettings>()),
        ("`[[pipelines]]`", to_strings(&super::PIPELINE_KEYS)),
        (
            "`[pipelines.source]`",
            fields_of::<crate::source::SourceConfig>(),
        ),
        (
            "`[pipelines.source.sasl]`",
            fields_of::<crate::source::SaslConfig>(),
        ),
        (
            "`[pipelines.source.tls]`",
            fields_of::<crate::source::TlsConfig>(),
        ),
        (
            "`[pipelines.decode]`",
            fields_of::<crate::decode::DecodeConfig>(),
        ),
        (
            "`[pipelines.decode.registry]`",
            fields_of::<crate::decode::registry::RegistryConfig>(),
        ),
        (
            "`[pipelines.schema]`",
            fields_of::<crate::schema::SchemaConfig>(),
        ),
        (
            "`[[pipelines.transforms]]`",
            fields_of::<crate::transform::TransformConfig>(),
        ),
        (
            "`[pipelines.transforms.limits]`",
            fields_of::<crate::transform::Limits>(),
        ),
        ("`[pipelines.sink]`", fields_of::<crate::sink::SinkConfig>()),
        (
            "`[pipelines.sink.maintenance]`",
            fields_of::<crate::sink::MaintenanceConfig>(),
        ),
        (
            "`[pipelines.dead_letter]`",
            fields_of::<crate::dead_letter::DeadLetterConfig>(),
        ),
    ];
    let tables = key_tables();
    let mut problems = Vec::new();
    for (heading, fields) in &sections {
        assert!(!fields.is_empty(), "{heading}: no fields found");
        let Some(table) = tables.iter().find(|t| t.heading == *heading) else {
            problems.push(format!("no table \"### {heading}\""));
            continue;
        };
        for f in fields {
            if !table.rows.iter().any(|[key, ..]| key == f) {
                problems.push(format!("{heading}: `{f}` is not in the table"));
            }
        }
        for [key, ty, default] in &table.rows {
            if !fields.contains(key) {
                problems.push(format!("{heading}: `{key}` is not a key of the section"));
            }
            if ty.is_empty() || default.is_empty() {
                problems.push(format!("{heading}: `{key}` needs a type and a default"));
            }
        }
    }
    for t in &tables {
        if !sections.iter().any(|(heading, _)| t.heading == *heading) {
            problems.push(format!(
                "### {}: a table no config struct is checked against",
                t.heading
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md, Every key: {problems:#?}"
    );
}
