//! Correct next to other writers: the pipeline in process (scripted source) on the real
//! embedded catalog, with faults injected at exact moments (`floe_tests::inject`) and
//! other writers (a second pipeline on the same table, maintenance) acting in between.
//! Every test ends by comparing every column of every row with both readers.
//!
//! - a stale table view (its files expired by another writer) does not stop a pipeline;
//! - a schema change is not lost when its commit is retried;
//! - a column another writer typed differently is checked against that type;
//! - a partition assigned back while its commit is in flight is not committed twice;
//! - a lost commit answer with another writer's commit right after it leaves one row per
//!   key;
//! - a commit the catalog never answers does not hold a stop past its grace.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use floe::source::SourceCommand;
use floe_tests::inject::{Faults, faulty_catalog};
use floe_tests::scripted::{ScriptedPipeline, messages};
use floe_tests::{Config, Pipeline, TableDump, Workspace, wait_for_messages};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// One pipeline on the workspace's embedded catalog: reads `topic` (from a broker
/// nobody listens on: the tests feed the source themselves), writes `ns.table`, dead
/// letters in `<name>.ndjson`.
fn pipeline(ws: &Workspace, name: &str, topic: &str, table: &str) -> Pipeline {
    Pipeline::new(name, "127.0.0.1:9", topic)
        .group_id(&format!("g-{name}"))
        .sink("local", "ns", table)
        .commit_interval("1s")
        .dead_letter(ws.path(&format!("{name}.ndjson")))
}

/// Writes `<name>.toml` with `pipeline` on the workspace's embedded catalog.
fn write(ws: &Workspace, name: &str, pipeline: Pipeline) -> Result<PathBuf> {
    Config::new()
        .catalog("local", ws.embedded_catalog())
        .pipeline(pipeline)
        .write(ws.path(&format!("{name}.toml")))
}

/// [`pipeline`] as it is, written to `<name>.toml`.
fn config(ws: &Workspace, name: &str, topic: &str, table: &str) -> Result<PathBuf> {
    write(ws, name, pipeline(ws, name, topic, table))
}

/// A pipeline on the workspace's catalog with faults the test controls.
async fn start(ws: &Workspace, config: &Path) -> Result<(ScriptedPipeline, Arc<Faults>)> {
    let (catalog, faults) = faulty_catalog(ws.dir.path(), "local").await?;
    Ok((
        ScriptedPipeline::start_on(config, Some(catalog)).await?,
        faults,
    ))
}

fn values(rows: &[Value]) -> Vec<String> {
    rows.iter().map(Value::to_string).collect()
}

fn refs(v: &[String]) -> Vec<Option<&str>> {
    v.iter().map(|s| Some(s.as_str())).collect()
}

/// Waits until the table covers `n` messages of `pipeline` (all in partition 0).
async fn covered(ws: &Workspace, table: &str, pipeline: &str, n: i64) -> Result<()> {
    let catalog = ws.catalog().await?;
    wait_for_messages(catalog.as_ref(), "ns", table, pipeline, n, WAIT).await?;
    Ok(())
}

/// Waits for the pipeline's next seek (a rewind) and returns its positions.
async fn next_seek(p: &ScriptedPipeline, after: usize) -> Result<Vec<(i32, Option<i64>)>> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let seeks = p.seeks();
        if seeks.len() > after
            && let SourceCommand::Seek { positions, .. } = &seeks[after]
        {
            return Ok(positions.iter().map(|((_, p), o)| (*p, *o)).collect());
        }
        if std::time::Instant::now() > deadline {
            bail!("no rewind");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Both readers, every column of every row (`_op` and the Kafka timestamp aside),
/// matched by `key`.
fn assert_table(ws: &Workspace, table: &str, key: &str, expected: &[Value]) -> Result<()> {
    for reader in ["pyiceberg", "duckdb"] {
        let dump: TableDump = ws.read(reader, "ns", table, key)?;
        floe_tests::reference::assert_rows(
            &format!("{reader}: ns.{table}"),
            &dump,
            expected,
            &[key],
            &["_op", "_kafka_timestamp"],
        )?;
    }
    Ok(())
}

/// An expected row: the payload plus the Kafka columns of partition 0, offset `offset`.
fn row(payload: Value, offset: i64) -> Value {
    let mut row = payload.as_object().cloned().unwrap_or_default();
    row.insert("_kafka_partition".into(), json!(0));
    row.insert("_kafka_offset".into(), json!(offset));
    row.insert("_kafka_key".into(), Value::Null);
    Value::Object(row)
}

/// The expected rows of `payloads` produced to partition 0 from offset 0.
fn in_order(payloads: &[Value]) -> Vec<Value> {
    payloads
        .iter()
        .enumerate()
        .map(|(i, v)| row(v.clone(), i as i64))
        .collect()
}

/// Item 0: another pipeline on the same table commits and maintenance expires every
/// older snapshot, deleting the manifest lists of the view this pipeline cached. Its
/// next commit reloads the table instead of stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_after_another_writers_expiry_does_not_stop_a_pipeline() -> Result<()> {
    stale_view(false, "append").await
}

/// The same on a format-v3 upsert table: the deletion vector the quiet pipeline would
/// merge with was replaced by the busy one's and deleted by expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_of_an_upsert_table_does_not_stop_a_pipeline() -> Result<()> {
    stale_view(true, "upsert").await
}

/// `upsert`: an upsert table on format v3, keyed by `id`.
async fn stale_view(upsert: bool, table: &str) -> Result<()> {
    let ws = Workspace::new()?;
    let sink = |p: Pipeline| {
        if upsert {
            p.upsert(&["id"]).set("sink.format_version", 3)
        } else {
            p
        }
    };
    let quiet_config = write(&ws, "quiet", sink(pipeline(&ws, "quiet", "q", table)))?;
    let busy_config = write(&ws, "busy", sink(pipeline(&ws, "busy", "b", table)))?;
    let (quiet, _) = start(&ws, &quiet_config).await?;
    quiet.assign("q", &[(0, None, vec![None])]);
    let first = vec![json!({"id": 1, "v": "q0"}), json!({"id": 2, "v": "q1"})];
    quiet.push(messages("q", 0, 0, &refs(&values(&first))));
    covered(&ws, table, "quiet", 2).await?;

    // The busy pipeline updates the same keys over several commits (upsert: replacing
    // the quiet one's rows and their deletion vectors).
    let (busy, _) = start(&ws, &busy_config).await?;
    busy.assign("b", &[(0, None, vec![None])]);
    let mut busy_rows = Vec::new();
    for i in 0..5 {
        let v = json!({"id": 1 + i % 2, "v": format!("b{i}")});
        busy_rows.push(v.clone());
        busy.push(messages("b", 0, i, &refs(&values(&[v]))));
        covered(&ws, table, "busy", i + 1).await?;
    }
    // Expiry keeps only the newest snapshot and deletes the files of the others.
    let catalog = floe_iceberg::open_catalog(
        "local",
        &floe_iceberg::CatalogConfig::embedded(ws.path("catalog.db"), ws.path("warehouse")),
    )
    .await?;
    let ident = iceberg::TableIdent::from_strs(["ns", table])?;
    let config = floe::maintain::MaintenanceConfig {
        keep_snapshots: 1,
        max_snapshot_age: Duration::ZERO,
        ..Default::default()
    };
    let t = catalog.catalog.load_table(&ident).await?;
    let report = floe_iceberg::expire::expire(&catalog, t, &config.expire_options(), false).await?;
    assert!(report.starts_with("removed"), "{report}");

    // The quiet pipeline gets a record again: it commits it.
    let late = json!({"id": 2, "v": "q2"});
    quiet.push(messages(
        "q",
        0,
        2,
        &refs(&values(std::slice::from_ref(&late))),
    ));
    covered(&ws, table, "quiet", 3).await?;
    anyhow::ensure!(!quiet.is_finished(), "the quiet pipeline stopped");
    quiet.stop().await??;
    busy.stop().await??;

    let expected: Vec<Value> = if table == "upsert" {
        // Key 1: the busy pipeline's last version; key 2: the quiet one's late record.
        vec![
            json!({"id": 1, "v": "b4", "_kafka_partition": 0, "_kafka_offset": 4, "_kafka_key": null}),
            row(late, 2),
        ]
    } else {
        let mut all = in_order(&first);
        all.extend(in_order(&busy_rows));
        all.push(row(late, 2));
        all
    };
    if table == "upsert" {
        assert_table(&ws, table, "id", &expected)
    } else {
        // Rows of two pipelines share offsets: tell them apart by their value.
        assert_table(&ws, table, "v", &expected)
    }
}

/// Item 1: the write of a seal that adds a column fails once; the retry must still
/// commit the column and its values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_survives_a_retried_write() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, faults) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let rows = [
        json!({"id": 1, "a": "x"}),
        json!({"id": 2, "a": "y", "b": 7, "c": 2.5}),
    ];
    p.push(messages("t", 0, 0, &refs(&values(&rows[..1]))));
    covered(&ws, "t", "p", 1).await?;
    faults.fail_writes(1);
    let seeks = p.seeks().len();
    p.push(messages("t", 0, 1, &refs(&values(&rows[1..]))));
    // The failed write's open file is gone: the records are read again.
    let positions = next_seek(&p, seeks).await?;
    assert_eq!(positions, [(0, Some(1))]);
    p.push(messages("t", 0, 1, &refs(&values(&rows[1..]))));
    covered(&ws, "t", "p", 2).await?;
    p.stop().await??;
    let expected = in_order(&rows);
    assert_table(&ws, "t", "id", &expected)
}

/// Item 1, at the commit: the commit of a seal that adds columns and widens `b` from
/// long to double keeps failing until the committer reloads the table and tries again
/// later, and a later commit lands with its answer lost. The retries
/// must commit the new columns and the widened type with their values (a retry on the
/// old schema would keep only the old columns and cast 2.5 back to a long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_survives_a_failed_commit_and_a_lost_answer() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, faults) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let rows = [
        json!({"id": 1, "a": "x"}),
        json!({"id": 2, "a": "y", "b": 7}),
        json!({"id": 3, "a": "z", "b": 2.5, "c": "new"}),
        json!({"id": 4, "b": 1.25, "d": true}),
    ];
    p.push(messages("t", 0, 0, &refs(&values(&rows[..1]))));
    covered(&ws, "t", "p", 1).await?;
    // More failures than the commit layer's own attempts (12): the committer gets the
    // transient error, reloads the table and commits again later.
    faults.fail_commits(14);
    p.push(messages("t", 0, 1, &refs(&values(&rows[1..3]))));
    covered(&ws, "t", "p", 3).await?;
    faults.lose_answers(1);
    p.push(messages("t", 0, 3, &refs(&values(&rows[3..]))));
    covered(&ws, "t", "p", 4).await?;
    p.stop().await??;
    let expected = in_order(&rows);
    assert_table(&ws, "t", "id", &expected)?;
    let catalog = ws.catalog().await?;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["ns", "t"])?)
        .await?;
    let schema = table.metadata().current_schema();
    for (column, want) in [("b", "double"), ("c", "string"), ("d", "boolean")] {
        let field = schema
            .field_by_name(column)
            .with_context(|| format!("column {column} missing"))?;
        ensure!(
            field.field_type.to_string() == want,
            "column {column} is {}, not {want}",
            field.field_type
        );
    }
    Ok(())
}

/// Item 2: another writer added `x` as a long; a record of this pipeline with a string
/// `x` is checked against it (dead-lettered, as a single writer would), not admitted as
/// a new string column and then cast to null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_another_writer_typed_is_checked_against_its_type() -> Result<()> {
    let ws = Workspace::new()?;
    let c1 = config(&ws, "p1", "t1", "t")?;
    let c2 = config(&ws, "p2", "t2", "t")?;
    let (p1, _) = start(&ws, &c1).await?;
    p1.assign("t1", &[(0, None, vec![None])]);
    p1.push(messages("t1", 0, 0, &[Some(r#"{"y": 1}"#)]));
    covered(&ws, "t", "p1", 1).await?;
    let (p2, _) = start(&ws, &c2).await?;
    p2.assign("t2", &[(0, None, vec![None])]);
    p2.push(messages("t2", 0, 0, &[Some(r#"{"x": 5}"#)]));
    covered(&ws, "t", "p2", 1).await?;
    p2.stop().await??;
    // p1 commits again: its view of the table now has `x`, its admission never saw it.
    p1.push(messages("t1", 0, 1, &[Some(r#"{"y": 3}"#)]));
    covered(&ws, "t", "p1", 2).await?;

    let seeks = p1.seeks().len();
    let late = [Some(r#"{"x": "abc"}"#)];
    p1.push(messages("t1", 0, 2, &late));
    // The commit finds `x` typed otherwise by the other writer: the pipeline reads the
    // record again (the real source would seek; the script delivers it again).
    let positions = next_seek(&p1, seeks).await?;
    assert_eq!(positions, [(0, Some(2))]);
    p1.push(messages("t1", 0, 2, &late));
    p1.push(messages("t1", 0, 3, &[Some(r#"{"x": 6, "y": 2}"#)]));
    covered(&ws, "t", "p1", 4).await?;
    p1.stop().await??;

    let letters = floe::dead_letter::DeadLetterWriter::read_all(&ws.path("p1.ndjson"))?;
    let dead: Vec<(i64, &str)> = letters
        .iter()
        .map(|l| (l.offset, l.stage.as_str()))
        .collect();
    assert_eq!(dead, [(2, "schema")], "{letters:?}");
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "t", "y")?;
        let got: Vec<(Value, Value)> = dump
            .rows()
            .iter()
            .map(|r| (r["x"].clone(), r["y"].clone()))
            .collect();
        assert_eq!(
            got,
            [
                (json!(5), Value::Null),
                (Value::Null, json!(1)),
                (json!(6), json!(2)),
                (Value::Null, json!(3))
            ],
            "{reader}"
        );
    }
    Ok(())
}

/// Item 3: partition 0 is revoked and assigned back while a commit of it is in flight;
/// the assignment read the table before that commit landed and the records are
/// delivered again. They must not be committed a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_back_mid_commit_is_not_committed_twice() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, faults) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let rows: Vec<Value> = (0..11)
        .map(|i| json!({"id": i, "v": format!("v{i}")}))
        .collect();
    let texts = values(&rows);
    p.push(messages("t", 0, 0, &refs(&texts[..1])));
    covered(&ws, "t", "p", 1).await?;
    faults.hold_commits(1);
    p.push(messages("t", 0, 1, &refs(&texts[1..])));
    faults.wait_holding(WAIT).await?;
    p.revoke(vec![(Arc::from("t"), 0)]);
    // What a fresh lookup reads now: the held commit has not landed.
    p.assign("t", &[(0, Some(1), vec![Some(1)])]);
    p.push(messages("t", 0, 1, &refs(&texts[1..])));
    p.drained(WAIT).await?;
    faults.release();
    covered(&ws, "t", "p", 11).await?;
    // Let the next seal (the records read again) reach the committer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    p.stop().await??;
    let expected = in_order(&rows);
    assert_table(&ws, "t", "id", &expected)
}

/// Item 4: an upsert commit lands but its answer is lost, and another writer commits
/// (updating a key) before this pipeline reloads. Its next commit must delete that
/// writer's row of the key it updates: one live row per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_then_another_writer_leaves_one_row_per_key() -> Result<()> {
    let ws = Workspace::new()?;
    let c1 = write(&ws, "p1", pipeline(&ws, "p1", "t1", "t").upsert(&["id"]))?;
    let c2 = write(&ws, "p2", pipeline(&ws, "p2", "t2", "t").upsert(&["id"]))?;
    let (p1, faults) = start(&ws, &c1).await?;
    p1.assign("t1", &[(0, None, vec![None])]);
    p1.push(messages("t1", 0, 0, &[Some(r#"{"id": 1, "v": "a"}"#)]));
    covered(&ws, "t", "p1", 1).await?;

    // p1's next commit lands, its answer is lost, and it is held before p1 looks again.
    faults.lose_answers(1);
    faults.hold_after_lost_answer();
    p1.push(messages("t1", 0, 1, &[Some(r#"{"id": 3, "v": "x"}"#)]));
    faults.wait_holding(WAIT).await?;
    let (p2, _) = start(&ws, &c2).await?;
    p2.assign("t2", &[(0, None, vec![None])]);
    p2.push(messages("t2", 0, 0, &[Some(r#"{"id": 1, "v": "b"}"#)]));
    covered(&ws, "t", "p2", 1).await?;
    p2.stop().await??;
    faults.release();
    covered(&ws, "t", "p1", 2).await?;

    p1.push(messages("t1", 0, 2, &[Some(r#"{"id": 1, "v": "c"}"#)]));
    covered(&ws, "t", "p1", 3).await?;
    p1.stop().await??;
    let expected = vec![
        row(json!({"id": 1, "v": "c"}), 2),
        row(json!({"id": 3, "v": "x"}), 1),
    ];
    assert_table(&ws, "t", "id", &expected).context("one live row per key")
}

/// Creating the table fails once (its metadata file cannot be written): the pipeline
/// tries again and creates it, every row exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_table_creation_is_tried_again() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, faults) = start(&ws, &c).await?;
    faults.fail_metadata_writes(1);
    p.assign("t", &[(0, None, vec![None])]);
    let rows: Vec<Value> = (0..5)
        .map(|i| json!({"id": i, "v": format!("v{i}")}))
        .collect();
    p.push(messages("t", 0, 0, &refs(&values(&rows))));
    covered(&ws, "t", "p", 5).await?;
    p.stop().await??;
    let expected = in_order(&rows);
    assert_table(&ws, "t", "id", &expected)
}

/// `max_columns`: a record that would take the table past the limit is dead-lettered
/// alone; the others commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_past_the_width_cap_is_dead_lettered_alone() -> Result<()> {
    let ws = Workspace::new()?;
    let c = write(
        &ws,
        "p",
        pipeline(&ws, "p", "t", "t").schema("max_columns", 3),
    )?;
    let (p, _) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let wide = json!({"id": 1, "a": "z", "b": "w", "c": 3});
    let rows = [json!({"id": 0, "a": "x"}), wide, json!({"id": 2, "b": "y"})];
    p.push(messages("t", 0, 0, &refs(&values(&rows))));
    covered(&ws, "t", "p", 3).await?;
    p.stop().await??;
    let letters = floe::dead_letter::DeadLetterWriter::read_all(&ws.path("p.ndjson"))?;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].offset, 1);
    assert!(letters[0].reason.contains("max_columns = 3"), "{letters:?}");
    let expected = vec![row(rows[0].clone(), 0), row(rows[2].clone(), 2)];
    assert_table(&ws, "t", "id", &expected)
}

/// A seek that fails after a rewind stops the pipeline (reading on would skip records
/// it dropped); nothing past the committed offsets is committed, and a restart reads
/// from the table's offsets, every row exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_seek_after_a_rewind_stops_the_pipeline_safely() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, faults) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let rows: Vec<Value> = (0..8)
        .map(|i| json!({"id": i, "v": format!("v{i}")}))
        .collect();
    let texts = values(&rows);
    p.push(messages("t", 0, 0, &refs(&texts[..3])));
    covered(&ws, "t", "p", 3).await?;
    // A commit held in flight, the partition assigned back: the next seal rewinds.
    faults.hold_commits(1);
    p.push(messages("t", 0, 3, &refs(&texts[3..5])));
    faults.wait_holding(WAIT).await?;
    let seeks = p.seeks().len();
    p.revoke(vec![(Arc::from("t"), 0)]);
    p.assign("t", &[(0, Some(3), vec![Some(3)])]);
    p.push(messages("t", 0, 3, &refs(&texts[3..5])));
    p.drained(WAIT).await?;
    faults.release();
    next_seek(&p, seeks).await?;
    // The consumer could not apply the seek.
    p.script.send(floe::source::SourceEvent::Failed(
        "seek failed: t/0: Local: Erroneous state".into(),
    ));
    let deadline = std::time::Instant::now() + WAIT;
    while !p.is_finished() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the pipeline did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ended = p.stop().await?;
    let e = ended.expect_err("stopped with the source's error");
    assert!(e.to_string().contains("seek failed"), "{e}");
    let catalog = ws.catalog().await?;
    assert_eq!(
        floe_tests::covered_messages(catalog.as_ref(), "ns", "t", "p").await?,
        5,
        "nothing past the committed records"
    );
    // Restarted: reading resumes at the table's offsets.
    let (p, _) = start(&ws, &c).await?;
    p.assign("t", &[(0, Some(5), vec![Some(5)])]);
    p.push(messages("t", 0, 5, &refs(&texts[5..])));
    covered(&ws, "t", "p", 8).await?;
    p.stop().await??;
    let expected = in_order(&rows);
    assert_table(&ws, "t", "id", &expected)
}

/// Records lost to retention before they were read (the source resumed at the oldest
/// record, as `auto.offset.reset = earliest` makes it): the gap is counted and recorded
/// in the snapshot summary. (The test broker cannot delete records, so the source's
/// gap event is scripted here; its detection is the first-record check of the source.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_gap_is_recorded_in_the_snapshot() -> Result<()> {
    let ws = Workspace::new()?;
    let c = config(&ws, "p", "t", "t")?;
    let (p, _) = start(&ws, &c).await?;
    p.assign("t", &[(0, None, vec![None])]);
    p.push(messages("t", 0, 0, &[Some(r#"{"id": 0}"#)]));
    covered(&ws, "t", "p", 1).await?;
    p.script.send(floe::source::SourceEvent::Gap {
        tp: (Arc::from("t"), 0),
        expected: 1,
        found: 40,
    });
    p.push(messages("t", 0, 40, &[Some(r#"{"id": 40}"#)]));
    let catalog = ws.catalog().await?;
    wait_for_messages(catalog.as_ref(), "ns", "t", "p", 41, WAIT).await?;
    p.stop().await??;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["ns", "t"])?)
        .await?;
    let gaps: Vec<String> = table
        .metadata()
        .snapshots()
        .filter_map(|s| {
            s.summary()
                .additional_properties
                .get("floe.offset-gaps")
                .cloned()
        })
        .collect();
    assert_eq!(gaps, [r#"{"t":{"0":[1,40]}}"#]);
    Ok(())
}

/// A commit the catalog never answers does not hold a stop past its grace: the pipeline
/// ends in about 20 s, the records of that commit stay out of the table, and the next
/// start commits them once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_catalog_never_answers_does_not_hold_a_stop() -> Result<()> {
    let ws = Workspace::new()?;
    let config = config(&ws, "p", "t", "t")?;
    let rows: Vec<Value> = (0..10).map(|i| json!({"id": i, "v": i * 7})).collect();
    let texts = values(&rows);
    let (p, faults) = start(&ws, &config).await?;
    p.assign("t", &[(0, None, vec![None])]);
    p.push(messages("t", 0, 0, &refs(&texts[..5])));
    covered(&ws, "t", "p", 5).await?;
    faults.hold_commits(1);
    p.push(messages("t", 0, 5, &refs(&texts[5..])));
    faults.wait_holding(WAIT).await?;
    let started = std::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(90), p.stop()).await;
    let took = started.elapsed();
    faults.release();
    ensure!(
        stopped.is_ok(),
        "the stop waited for a commit that never ends"
    );
    ensure!(took < Duration::from_secs(45), "the stop took {took:?}");

    let (p, _) = start(&ws, &config).await?;
    p.assign("t", &[(0, Some(5), vec![Some(5)])]);
    p.push(messages("t", 0, 5, &refs(&texts[5..])));
    covered(&ws, "t", "p", 10).await?;
    p.stop().await??;
    assert_table(&ws, "t", "id", &in_order(&rows))
}
