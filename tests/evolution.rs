//! Schema evolution end to end: declared safe widenings (int -> long, float -> double,
//! decimal precision increase) of committed columns, produced with confluent-kafka's real
//! `AvroSerializer`, and new fields — each schema change committed in the same snapshot
//! (the same metadata version) as the rows written with it.

use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe::schema::type_name;
use floe_tests::{Broker, PipelineSpec, Registry, Transform, Workspace, spawn_agent};
use iceberg::TableIdent;
use iceberg::spec::{Snapshot, TableMetadata};
use serde_json::{Value, json};

const V1: &str = r#"{"type": "record", "name": "Reading", "namespace": "plant", "fields": [
  {"name": "id", "type": "long"},
  {"name": "n", "type": "int"},
  {"name": "ratio", "type": "float"},
  {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}
]}"#;

/// V1 with every payload column widened: int -> long, float -> double, decimal(9,2) -> decimal(12,2).
fn v2() -> String {
    V1.replace(r#""type": "int""#, r#""type": "long""#)
        .replace(r#""type": "float""#, r#""type": "double""#)
        .replace(r#""precision": 9"#, r#""precision": 12"#)
}

fn reading(id: i64, n: i64, ratio: f64, price: &str) -> Value {
    json!({"id": id, "n": n, "ratio": ratio, "price": price})
}

fn total_records(s: &Snapshot) -> i64 {
    s.summary()
        .additional_properties
        .get("total-records")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Asserts that the snapshot which took the table past `rows_before` rows also made its
/// schema current, in one metadata version: the version just before it is the parent
/// snapshot's, with the older schema. Also: one metadata file per snapshot (plus the
/// table's creation), so no schema-only version was written anywhere.
async fn assert_schema_committed_with_rows(
    ws: &Workspace,
    namespace: &str,
    name: &str,
    rows_before: i64,
) -> Result<()> {
    let table = ws
        .catalog()
        .await?
        .load_table(&TableIdent::from_strs([namespace, name])?)
        .await?;
    let meta = table.metadata();
    let mut snapshots: Vec<_> = meta.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    let added = snapshots
        .iter()
        .find(|s| total_records(s) > rows_before)
        .context("a snapshot adds the later rows")?;
    assert_eq!(
        added.schema_id(),
        Some(meta.current_schema_id()),
        "the snapshot adding the rows is written with the new current schema"
    );
    let parent = meta
        .snapshot_by_id(added.parent_snapshot_id().context("has a parent")?)
        .context("parent snapshot")?;
    assert_ne!(
        parent.schema_id(),
        added.schema_id(),
        "the parent snapshot has the older schema"
    );

    let mut files: Vec<String> = meta
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.clone())
        .collect();
    let current = table.metadata_location().context("metadata location")?;
    files.push(current.to_string());
    assert_eq!(
        files.len(),
        snapshots.len() + 1,
        "one metadata version for the creation, then one per snapshot: {files:?}"
    );
    let dir = current
        .trim_start_matches("file://")
        .rsplit_once('/')
        .context("metadata dir")?
        .0;
    let on_disk = std::fs::read_dir(dir)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".metadata.json"))
        })
        .count();
    assert_eq!(on_disk, files.len(), "metadata files in {dir}");

    let mut versions = Vec::new();
    for f in &files {
        versions.push(TableMetadata::read_from(table.file_io(), f).await?);
    }
    let i = versions
        .iter()
        .position(|m| m.snapshot_by_id(added.snapshot_id()).is_some())
        .context("a metadata version introduces the snapshot")?;
    let (before, with) = (&versions[i - 1], &versions[i]);
    assert_eq!(
        before.current_snapshot_id(),
        Some(parent.snapshot_id()),
        "the version before the new schema is the parent snapshot's"
    );
    assert_eq!(Some(before.current_schema_id()), parent.schema_id());
    assert_eq!(with.current_snapshot_id(), Some(added.snapshot_id()));
    assert_eq!(with.current_schema_id(), meta.current_schema_id());
    assert_eq!(
        with.schemas_iter().count(),
        before.schemas_iter().count() + 1,
        "that one version adds exactly the new schema"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widenings_commit_with_their_data_and_readers_see_exact_values() -> Result<()> {
    widenings(None).await
}

/// Through a plugin the writer schema is a hint per record; the widenings are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widenings_through_a_plugin_commit_the_same_way() -> Result<()> {
    widenings(Some("passthrough")).await
}

/// v1 rows committed, then v2 rows that need the wider types (and one that fits none).
async fn widenings(plugin: Option<&str>) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("readings", 1).await?;
    let registry = Registry::start(None)?;
    registry.produce_avro(
        &broker.bootstrap,
        "readings",
        V1,
        &[
            reading(1, i32::MAX.into(), 1.5, "1234567.89"),
            reading(2, i32::MIN.into(), 1.1, "-0.01"),
            reading(3, 0, -0.25, "9999999.99"),
        ],
    )?;
    let ws = Workspace::new()?;
    let mut pipeline = ws
        .pipeline("readings", &broker.bootstrap, "readings")
        .table("plant", "readings")
        .format("avro")
        .registry(&registry.url);
    if let Some(name) = plugin {
        pipeline = pipeline.transform(Transform::new(floe_tests::plugin_path(name)));
    }
    let config = ws.write(&ws.config().pipeline(pipeline))?;
    let agent = spawn_agent(&config)?;
    // v1 is committed first: the widenings change columns that are in the table.
    ws.wait_for_rows("plant", "readings", 3, Duration::from_secs(60))
        .await?;
    let ident = TableIdent::from_strs(["plant", "readings"])?;
    let v1_schema = ws
        .catalog()
        .await?
        .load_table(&ident)
        .await?
        .metadata()
        .current_schema()
        .clone();

    // The serializer checks the digit count only: 12345678901.5 has 12 digits, but as
    // decimal(12,2) it is 12345678901.50, 13 digits. It fits no column: dead-lettered.
    registry.produce_avro(
        &broker.bootstrap,
        "readings",
        &v2(),
        &[
            reading(4, 3_000_000_000, 1.1, "1234567890.12"),
            reading(5, -5_000_000_000, 1e300, "-9999999999.99"),
            reading(6, 1, 0.5, "12345678901.5"),
            reading(7, 7, 2.5, "0.50"),
        ],
    )?;
    ws.wait_for_rows("plant", "readings", 6, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    // Field ids unchanged, types widened.
    let table = ws.catalog().await?.load_table(&ident).await?;
    let schema = table.metadata().current_schema();
    for (column, wide) in [
        ("id", "long"),
        ("n", "long"),
        ("ratio", "double"),
        ("price", "decimal(12, 2)"),
    ] {
        let now = schema.field_by_name(column).context("column")?;
        let then = v1_schema.field_by_name(column).context("v1 column")?;
        assert_eq!(now.id, then.id, "{column}: the field id does not change");
        assert_eq!(type_name(&now.field_type), wide, "{column}");
    }
    assert_eq!(
        v1_schema
            .field_by_name("n")
            .map(|f| type_name(&f.field_type)),
        Some("int".to_string())
    );
    assert_schema_committed_with_rows(&ws, "plant", "readings", 3).await?;

    let expect = [
        (1, json!(i32::MAX), (1.5f32) as f64, "1234567.89"),
        (2, json!(i32::MIN), (1.1f32) as f64, "-0.01"),
        (3, json!(0), (-0.25f32) as f64, "9999999.99"),
        (4, json!(3_000_000_000_i64), 1.1, "1234567890.12"),
        (5, json!(-5_000_000_000_i64), 1e300, "-9999999999.99"),
        (7, json!(7), 2.5, "0.50"),
    ];
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "plant", "readings", "id")?;
        let types: Vec<Value> = dump.0["columns"]
            .as_array()
            .context("columns")?
            .iter()
            .filter(|c| !c[0].as_str().is_some_and(|n| n.starts_with("_kafka")))
            .cloned()
            .collect();
        assert_eq!(
            types,
            vec![
                json!(["id", "long"]),
                json!(["n", "long"]),
                json!(["ratio", "double"]),
                json!(["price", "decimal(12, 2)"]),
            ],
            "{reader}"
        );
        let rows = dump.rows();
        assert_eq!(rows.len(), expect.len(), "{reader}: {rows:?}");
        for (row, (id, n, ratio, price)) in rows.iter().zip(&expect) {
            assert_eq!(row["id"], json!(id), "{reader}");
            assert_eq!(row["n"], *n, "{reader}: row {id}");
            // Old rows hold the float32 value exactly, read as a double.
            assert_eq!(row["ratio"].as_f64(), Some(*ratio), "{reader}: row {id}");
            assert_eq!(row["price"], json!(price), "{reader}: row {id}");
        }
    }

    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].offset, 5, "the sixth message");
    assert!(
        letters[0].reason.contains(
            "field `price`: column is decimal(12, 2), value is string \"12345678901.50\""
        ),
        "{}",
        letters[0].reason
    );
    // The original Avro bytes, Confluent header included.
    let bytes = B64.decode(letters[0].value_base64.as_deref().unwrap_or_default())?;
    assert_eq!(bytes.first(), Some(&0u8), "magic byte");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_is_committed_in_the_snapshot_of_its_rows() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("events", 1).await?;
    let produce = |values: &[&str]| {
        values
            .iter()
            .map(|v| (None, Some(v.as_bytes().to_vec())))
            .collect::<Vec<_>>()
    };
    broker
        .produce("events", &produce(&[r#"{"id": 1}"#, r#"{"id": 2}"#]))
        .await?;
    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "events",
        bootstrap: &broker.bootstrap,
        topic: "events",
        namespace: "app",
        table: "events",
        commit_interval: "1s",
    })?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("app", "events", 2, Duration::from_secs(60))
        .await?;
    broker
        .produce(
            "events",
            &produce(&[r#"{"id": 3, "note": "new"}"#, r#"{"id": 4}"#]),
        )
        .await?;
    ws.wait_for_rows("app", "events", 4, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    let table = ws
        .catalog()
        .await?
        .load_table(&TableIdent::from_strs(["app", "events"])?)
        .await?;
    let meta = table.metadata();
    let note = meta
        .current_schema()
        .field_by_name("note")
        .context("note column")?;
    let first = meta.schemas_iter().map(|s| s.schema_id()).min();
    let old_last = meta
        .schema_by_id(first.context("a schema")?)
        .context("first schema")?
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.id)
        .max()
        .context("columns")?;
    assert!(note.id > old_last, "new ids above the old last column id");
    assert_schema_committed_with_rows(&ws, "app", "events", 2).await?;
    Ok(())
}
