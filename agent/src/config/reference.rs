//! The configuration reference (`docs/configuration.md`, and `docs/catalogs.md` for
//! REST catalogs) checked against the config structs both ways, so neither can drift:
//! every key the reference shows parses (its commented-out keys uncommented), and every
//! field of every section is named in the docs.

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
                "unknown field",
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

#[test]
fn every_field_of_every_section_is_documented() {
    let docs: String = [
        "configuration.md",
        "catalogs.md",
        "types.md",
        "maintenance.md",
        "plugins.md",
        "upsert.md",
        "deploy.md",
    ]
    .iter()
    .map(|d| doc(d))
    .collect();
    let sections = [
        ("[agent]", fields_of::<super::AgentConfig>()),
        ("[metrics]", fields_of::<crate::telemetry::MetricsConfig>()),
        ("[plugins]", fields_of::<crate::transform::PluginsConfig>()),
        ("source", fields_of::<crate::source::SourceConfig>()),
        ("source.sasl", fields_of::<crate::source::SaslConfig>()),
        ("source.tls", fields_of::<crate::source::TlsConfig>()),
        ("decode", fields_of::<crate::decode::DecodeConfig>()),
        ("schema", fields_of::<crate::schema::SchemaConfig>()),
        ("sink", fields_of::<crate::sink::SinkConfig>()),
        ("maintenance", fields_of::<crate::sink::MaintenanceConfig>()),
        (
            "dead_letter",
            fields_of::<crate::dead_letter::DeadLetterConfig>(),
        ),
        (
            "REST catalog",
            fields_of::<floe_iceberg::rest::RestCatalogConfig>(),
        ),
        ("s3.*", fields_of::<floe_iceberg::rest::S3Settings>()),
        ("aws.*", fields_of::<floe_iceberg::aws::AwsSettings>()),
    ];
    let mut missing = Vec::new();
    for (section, fields) in &sections {
        assert!(!fields.is_empty(), "{section}: no fields found");
        for f in fields {
            // `key = ...`, `` `key` ``, `s3.key = ...`, `` `s3.key` ``, a section
            // `[pipelines.source.key]` or a prefix `key.name = ...`.
            let named = [
                format!("{f} ="),
                format!("`{f}`"),
                format!(".{f} ="),
                format!(".{f}`"),
                format!(".{f}]"),
                format!("{f}."),
            ]
            .iter()
            .any(|n| docs.contains(n.as_str()));
            if !named {
                missing.push(format!("{section}: {f}"));
            }
        }
    }
    assert!(missing.is_empty(), "fields no doc names: {missing:#?}");
}
