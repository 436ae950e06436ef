//! Golden tests: input fixtures -> expected Iceberg schema JSON (`agent/tests/golden/`).
//!
//! Each case is a folder of steps applied in name order; every step is one commit:
//! `NN-*.ndjson` records are observed (a rejected record is listed with its reason),
//! `NN-*.avsc` Avro schemas are declared as a writer schema would be. The first step
//! creates the table schema (`new_table_schema`); later steps evolve it
//! (`evolved_schema` with the table's highest field id). An optional `options.toml` is
//! the case's `[pipelines.schema]`. `expected.json` holds the final schema and the
//! rejections; `FLOE_BLESS=1 cargo test golden` rewrites it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::spec::Schema;
use serde_json::{Value, json};

use super::{SchemaConfig, SchemaTracker};
use crate::decode::avro::WriterSchema;
use crate::record::json::JsonObject;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Runs one case; returns the JSON document compared with `expected.json`.
fn run_case(dir: &Path) -> Value {
    let options = match std::fs::read_to_string(dir.join("options.toml")) {
        Ok(text) => toml::from_str::<SchemaConfig>(&text).unwrap().options(),
        Err(_) => SchemaConfig::default().options(),
    };
    let options = Arc::new(options);
    let mut steps: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("ndjson" | "avsc")
            )
        })
        .collect();
    steps.sort();
    let mut table: Option<Schema> = None;
    let mut rejected = Vec::new();
    let mut history = Vec::new();
    for step in &steps {
        let name = step.file_name().unwrap().to_string_lossy().to_string();
        let mut tracker = match &table {
            Some(t) => SchemaTracker::from_table(t),
            None => SchemaTracker::new(),
        }
        .with_options(options.clone());
        let text = std::fs::read_to_string(step).unwrap();
        if name.ends_with(".avsc") {
            let schema = WriterSchema::parse(None, &text).unwrap();
            tracker.declare(&schema.columns);
        } else {
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let record = JsonObject::parse(line.as_bytes().to_vec()).unwrap();
                if let Err(c) = tracker.observe_json(record.view().root(), None) {
                    rejected.push(format!("{name}:{}: {c}", i + 1));
                }
            }
        }
        let next = match &table {
            None => Some(tracker.new_table_schema().unwrap()),
            Some(t) => tracker.evolved_schema(t, t.highest_field_id()).unwrap(),
        };
        history.push(json!({"step": name, "changed": next.is_some()}));
        if let Some(next) = next {
            if let Some(old) = &table {
                assert_ids_stable(old, &next, &name);
            }
            table = Some(next);
        }
    }
    json!({
        "steps": history,
        "rejected": rejected,
        "schema": serde_json::to_value(table.expect("at least one step")).unwrap(),
    })
}

/// Every field of the old schema keeps its id, name and place in the new one.
fn assert_ids_stable(old: &Schema, new: &Schema, step: &str) {
    for (id, name) in old.field_id_to_name_map() {
        assert_eq!(
            new.name_by_field_id(*id),
            Some(name.as_str()),
            "{step}: field id {id} ({name}) changed"
        );
    }
}

#[test]
fn golden_cases_match() {
    let bless = std::env::var_os("FLOE_BLESS").is_some();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(cases.len() >= 7, "golden cases missing: {cases:?}");
    let mut failed = Vec::new();
    for case in &cases {
        let got = run_case(case);
        let expected_path = case.join("expected.json");
        let pretty = serde_json::to_string_pretty(&got).unwrap() + "\n";
        if bless {
            std::fs::write(&expected_path, &pretty).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != pretty {
            failed.push(format!(
                "{}:\n--- expected\n{expected}\n--- got\n{pretty}",
                case.display()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "golden mismatches (FLOE_BLESS=1 rewrites):\n{}",
        failed.join("\n")
    );
}
