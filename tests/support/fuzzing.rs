//! Fuzz targets as plain functions: `fuzz/` (cargo-fuzz, libFuzzer) calls them with
//! generated inputs, and `tests/fuzz_corpus.rs` replays the stored corpus through them
//! in CI. Each takes arbitrary bytes and must return (never panic, abort or hang) for
//! any input; the invariants checked are the ones the agent relies on.

use std::sync::{Arc, Once};

use floe::batch::{RowBuffer, RowMeta};
use floe::decode::avro::{WriterSchema, split_confluent};
use floe::decode::{DecodeConfig, Decoder};
use floe::record::TopicPartition;
use floe::record::json::Tape;
use floe::schema::{Admission, OnIncompatible, SchemaTracker, TableSchema};

/// A fuzz target: any bytes in, no panic out.
pub type Target = fn(&[u8]);

/// The targets, by name (the names of `fuzz/fuzz_targets/*.rs` and `fuzz/corpus/*`).
pub const TARGETS: &[(&str, Target)] = &[
    ("json_admission", json_admission),
    ("avro_decode", avro_decode),
    ("registry_response", registry_response),
    ("rest_response", rest_response),
    ("config_load", config_load),
];

/// Sets the process-wide Avro allocation bound, as every pipeline's decoder does, and
/// the default panic hook: libFuzzer's aborts at any panic, even one the agent catches
/// on purpose (apache-avro's, see `WriterSchema::parse`); a panic that escapes a target
/// still aborts (libfuzzer-sys checks every call).
fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = std::panic::take_hook();
        Decoder::new(&DecodeConfig::default()).expect("default decoder");
    });
}

/// JSON decode and schema admission: each line is a message value. Whatever is admitted
/// must encode into Arrow, seal after seal, and the table schema must build as the
/// committer builds it: created at the first seal with rows, evolved at the next ones.
pub fn json_admission(data: &[u8]) {
    init();
    let mut table: Option<iceberg::spec::Schema> = None;
    let mut schema = TableSchema::new(SchemaTracker::new(), OnIncompatible::DeadLetter, None);
    let mut buffer = RowBuffer::new();
    let mut tape = Tape::new();
    let tp: TopicPartition = (Arc::from("t"), 0);
    let mut admitted = 0;
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        let Ok(view) = tape.parse(line) else {
            continue;
        };
        let root = view.root();
        let Admission::Admit(a) = schema.admit(Some(root), None, None, None) else {
            continue;
        };
        let meta = RowMeta {
            partition: 0,
            offset: i as i64,
            timestamp_ms: Some(i as i64),
            key: None,
            headers: &[],
        };
        let rewritten = a.rewritten.as_ref().map(|o| o.view());
        let value = rewritten.as_ref().map_or(root, |v| v.root());
        buffer
            .append(&schema.tracker, &tp, meta, Some(value), a.key, 1)
            .expect("an admitted row appends");
        admitted += 1;
        if i % 5 == 4 {
            seal(&mut schema, &mut buffer, &mut table, admitted);
            admitted = 0;
        }
    }
    seal(&mut schema, &mut buffer, &mut table, admitted);
}

/// What a seal does to the buffer and the table schema.
fn seal(
    schema: &mut TableSchema,
    buffer: &mut RowBuffer,
    table: &mut Option<iceberg::spec::Schema>,
    rows: usize,
) {
    buffer.take().expect("admitted rows encode");
    if rows == 0 {
        return;
    }
    let next = match table {
        None => Some(
            schema
                .tracker
                .new_table_schema()
                .expect("a new table's schema builds from admitted rows"),
        ),
        Some(current) => schema
            .tracker
            .evolved_schema(current, current.highest_field_id())
            .expect("the table's schema evolves to admitted rows"),
    };
    if next.is_some() {
        *table = next;
    }
    schema.tracker.lock_all();
}

/// Writer schemas the Avro target decodes with, chosen by the first input byte.
const AVRO_SCHEMAS: &[&str] = &[
    r#"{"type":"record","name":"r","fields":[{"name":"id","type":"long"},{"name":"xs","type":{"type":"array","items":"long"}}]}"#,
    r#"{"type":"record","name":"r","fields":[{"name":"m","type":{"type":"map","values":"string"}},{"name":"u","type":["null","string","double"]}]}"#,
    r#"{"type":"record","name":"r","fields":[{"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},{"name":"f","type":{"type":"fixed","name":"f16","size":16}},{"name":"t","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"day","type":{"type":"int","logicalType":"date"}}]}"#,
    r#"{"type":"record","name":"r","fields":[{"name":"inner","type":{"type":"record","name":"i","fields":[{"name":"v","type":"int"},{"name":"ys","type":{"type":"array","items":{"type":"map","values":["null","long"]}}}]}}]}"#,
    r#"{"type":"record","name":"r","fields":[{"name":"e","type":{"type":"enum","name":"e","symbols":["A","B"]}},{"name":"s","type":"string"},{"name":"b","type":"boolean"},{"name":"fl","type":"float"}]}"#,
];

/// Avro decode with registry schemas: the first byte picks a schema; the rest is a
/// Confluent-framed message (or a bare datum if the frame is not there). A decoded
/// record must parse as JSON and go through admission.
pub fn avro_decode(data: &[u8]) {
    init();
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = AVRO_SCHEMAS[pick as usize % AVRO_SCHEMAS.len()];
    let schema = WriterSchema::parse(Some(1), text).expect("fixed schema parses");
    let datum = split_confluent(rest).map_or(rest, |(_, d)| d);
    if let Ok(object) = schema.decode(datum) {
        let mut tape = Tape::new();
        tape.parse(object.as_bytes())
            .expect("a decoded record is valid JSON");
        json_admission(object.as_bytes());
    }
    let _ = schema.decode_any(datum);
}

/// A registry answer to `GET /schemas/ids/{id}`: `{"schema": "...", "schemaType"}`,
/// or the bare schema text; a schema that parses must also map to columns and decode.
pub fn registry_response(data: &[u8]) {
    init();
    #[derive(serde::Deserialize)]
    struct Answer {
        schema: String,
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let schema = match serde_json::from_str::<Answer>(text) {
        Ok(a) => a.schema,
        Err(_) => text.to_string(),
    };
    if let Ok(s) = WriterSchema::parse(Some(7), &schema) {
        let _ = s.decode(&[0, 2, 4, 6, 8]);
        let _ = s.decode_any(&[]);
    }
}

/// REST catalog answers: load-table (metadata with the offsets Floe keeps in snapshot
/// summaries), listings and commit answers.
pub fn rest_response(data: &[u8]) {
    use iceberg_catalog_rest::{
        CommitTableResponse, ListNamespaceResponse, ListTablesResponse, LoadTableResult,
    };
    if let Ok(loaded) = serde_json::from_slice::<LoadTableResult>(data) {
        let _ = floe_iceberg::OffsetMap::from_table(&loaded.metadata, "p");
    }
    if let Ok(m) = serde_json::from_slice::<iceberg::spec::TableMetadata>(data) {
        let _ = floe_iceberg::OffsetMap::from_table(&m, "p");
    }
    let _ = serde_json::from_slice::<ListNamespaceResponse>(data);
    let _ = serde_json::from_slice::<ListTablesResponse>(data);
    let _ = serde_json::from_slice::<CommitTableResponse>(data);
}

/// The config loader: any text gives a config or a list of errors, never a panic.
pub fn config_load(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name.len() < 8).then(|| format!("v-{name}"));
    if let Ok(c) = floe::config::Config::parse(text, &env) {
        let _ = format!("{c:?}");
    }
}
