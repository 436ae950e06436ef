//! The real pipeline in-process on a scripted source (no broker): dead-letter dedupe on
//! restart, a fenced zombie rewinding, revocation mid-batch, routing to several tables
//! with offsets that never go back. Every table is read back by PyIceberg and DuckDB.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use floe::dead_letter::DeadLetterWriter;
use floe::source::SourceCommand;
use floe_tests::scripted::{ScriptedPipeline, messages};
use floe_tests::{Pipeline, Transform, Workspace, committed_rows, plugin_path};
use serde_json::{Value, json};

/// A workspace with the config of the in-process pipeline `name` (topic `t` into
/// `ns.NAME`).
fn workspace(name: &str) -> Result<(Workspace, std::path::PathBuf)> {
    workspace_with(name, |p| p)
}

/// [`workspace`], the pipeline completed by `more`.
fn workspace_with(
    name: &str,
    more: impl FnOnce(Pipeline) -> Pipeline,
) -> Result<(Workspace, std::path::PathBuf)> {
    let ws = Workspace::new()?;
    let pipeline = ws.pipeline(name, "127.0.0.1:9", "t").table("ns", name);
    let config = ws.write(&ws.config().pipeline(more(pipeline)))?;
    Ok((ws, config))
}

fn json(i: i64) -> String {
    format!(r#"{{"id": {i}, "v": "x{i}"}}"#)
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

async fn stored(ws: &Workspace, table: &str, pipeline: &str) -> Result<Vec<(i32, i64)>> {
    let catalog = ws.catalog().await?;
    let t = catalog
        .load_table(&iceberg::TableIdent::from_strs(["ns", table])?)
        .await?;
    let mut out: Vec<(i32, i64)> = floe_iceberg::OffsetMap::from_table(t.metadata(), pipeline)?
        .0
        .into_iter()
        .map(|((_, p), o)| (p, o))
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_not_written_twice_when_records_are_read_again() -> Result<()> {
    let (ws, config) = workspace("dedupe")?;
    let values: Vec<String> = (0..10)
        .map(|i| {
            if i % 4 == 1 {
                "{bad".to_string()
            } else {
                json(i)
            }
        })
        .collect();
    let refs: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, None, vec![None])]);
    p.push(messages("t", 0, 0, &refs));
    p.stop().await??;
    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(
        letters.iter().map(|l| l.offset).collect::<Vec<_>>(),
        [1, 5, 9]
    );

    // A restart that reads everything again (the group position was lost, say): the
    // table says it holds up to 10, the dead letters are already in the file.
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, None, vec![Some(10)])]);
    p.push(messages("t", 0, 0, &refs));
    p.push(messages("t", 0, 10, &[Some(&json(10)), Some("{bad")]));
    p.stop().await??;
    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(
        letters.iter().map(|l| l.offset).collect::<Vec<_>>(),
        [1, 5, 9, 11],
        "each bad record once"
    );
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "dedupe", "id")?;
        assert_eq!(ids(dump.rows()), [0, 2, 3, 4, 6, 7, 8, 10], "{reader}");
    }
    assert_eq!(stored(&ws, "dedupe", "dedupe").await?, [(0, 12)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_zombie_rewinds_to_the_table_and_duplicates_nothing() -> Result<()> {
    let (ws, config) = workspace("fence")?;
    let first: Vec<String> = (0..10).map(json).collect();
    let first: Vec<Option<&str>> = first.iter().map(|v| Some(v.as_str())).collect();
    // The zombie: assigned partition 0 from the start, its records not committed yet.
    let zombie = ScriptedPipeline::start(&config).await?;
    zombie.assign("t", &[(0, None, vec![None])]);
    zombie.push(messages("t", 0, 0, &first));
    zombie.drained(Duration::from_secs(30)).await?;
    // The new owner commits the same records first.
    let owner = ScriptedPipeline::start(&config).await?;
    owner.assign("t", &[(0, None, vec![None])]);
    owner.push(messages("t", 0, 0, &first));
    owner.stop().await??;
    assert_eq!(stored(&ws, "fence", "fence").await?, [(0, 10)]);
    // The zombie's commit is fenced: it goes back to what the table stores (offset 10)
    // in a new epoch, and records of the old epoch are ignored. If its table creation
    // met the owner's between the owner's creation and its data commit, it first goes
    // back to the table as it was then (nothing stored): delivered again, as a broker
    // would, those records are fenced by the owner's commit.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut redelivered = 0;
    let seek = loop {
        if let Some(SourceCommand::Seek { epoch, positions }) = zombie.seeks().pop() {
            if positions == vec![((Arc::from("t"), 0), None)] && redelivered < epoch {
                zombie.push(messages("t", 0, 0, &first));
                redelivered = epoch;
            } else if positions != vec![((Arc::from("t"), 0), None)] {
                break (epoch, positions);
            }
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no seek to the owner's offsets after the fence"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(seek.0 >= 1, "a new epoch");
    assert_eq!(seek.1, vec![((Arc::from("t"), 0), Some(10))]);
    zombie.push(messages("t", 0, 10, &[Some(&json(10))]));
    zombie.stop().await??;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "fence", "id")?;
        assert_eq!(ids(dump.rows()), (0..=10).collect::<Vec<_>>(), "{reader}");
    }
    assert_eq!(stored(&ws, "fence", "fence").await?, [(0, 11)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_partition_mid_batch_drops_only_its_records() -> Result<()> {
    let (ws, config) = workspace("revoke")?;
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, None, vec![None]), (1, None, vec![None])]);
    let a: Vec<String> = (0..5).map(json).collect();
    let b: Vec<String> = (100..105).map(json).collect();
    p.push(messages(
        "t",
        0,
        0,
        &a.iter().map(|v| Some(v.as_str())).collect::<Vec<_>>(),
    ));
    p.push(messages(
        "t",
        1,
        0,
        &b.iter().map(|v| Some(v.as_str())).collect::<Vec<_>>(),
    ));
    p.revoke(vec![(Arc::from("t"), 1)]);
    p.push(messages("t", 0, 5, &[Some(&json(5))]));
    p.stop().await??;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "revoke", "id")?;
        assert_eq!(ids(dump.rows()), (0..=5).collect::<Vec<_>>(), "{reader}");
    }
    assert_eq!(
        stored(&ws, "revoke", "revoke").await?,
        [(0, 6)],
        "the revoked partition's offsets are left to its new owner"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_tables_each_hold_every_record_once_and_offsets_never_go_back() -> Result<()> {
    let (ws, config) = workspace_with("routed", |p| {
        p.stream("eu", "routed_eu").transform(
            Transform::new(plugin_path("route"))
                .with(json!({"field": "region", "routes": {"eu": "eu"}})),
        )
    })?;
    let record = |i: i64| {
        let region = if i % 2 == 0 { "eu" } else { "us" };
        format!(r#"{{"id": {i}, "region": "{region}"}}"#)
    };
    let all: Vec<String> = (0..20).map(record).collect();
    let refs: Vec<Option<&str>> = all.iter().map(|v| Some(v.as_str())).collect();
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, None, vec![None, None])]);
    p.push(messages("t", 0, 0, &refs[..10]));
    p.stop().await??;
    assert_eq!(stored(&ws, "routed", "routed").await?, [(0, 10)]);
    assert_eq!(stored(&ws, "routed_eu", "routed").await?, [(0, 10)]);
    // Reading again from behind what the tables hold (a stale position): both tables
    // skip what they hold, and stopping there does not move their offsets back to 7.
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, Some(4), vec![Some(10), Some(10)])]);
    p.push(messages("t", 0, 4, &refs[4..7]));
    p.stop().await??;
    assert_eq!(stored(&ws, "routed", "routed").await?, [(0, 10)]);
    assert_eq!(stored(&ws, "routed_eu", "routed").await?, [(0, 10)]);
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, Some(10), vec![Some(10), Some(10)])]);
    p.push(messages("t", 0, 10, &refs[10..]));
    p.stop().await??;
    assert_eq!(stored(&ws, "routed", "routed").await?, [(0, 20)]);
    assert_eq!(stored(&ws, "routed_eu", "routed").await?, [(0, 20)]);
    for reader in ["pyiceberg", "duckdb"] {
        let default = ws.read(reader, "ns", "routed", "id")?;
        let eu = ws.read(reader, "ns", "routed_eu", "id")?;
        let want = |r: i64| (0..20).filter(|i| i % 2 == r).collect::<BTreeSet<i64>>();
        assert_eq!(
            ids(default.rows()).into_iter().collect::<BTreeSet<_>>(),
            want(1),
            "{reader}"
        );
        assert_eq!(default.rows().len(), 10, "{reader}: no duplicates");
        assert_eq!(
            ids(eu.rows()).into_iter().collect::<BTreeSet<_>>(),
            want(0),
            "{reader}"
        );
        assert_eq!(eu.rows().len(), 10, "{reader}: no duplicates");
    }
    let catalog = ws.catalog().await?;
    assert_eq!(committed_rows(catalog.as_ref(), "ns", "routed").await?, 10);
    Ok(())
}

/// Upsert keyed by a payload field with `coerce`: the key is read after coercion, so
/// `{"id": "7"}` and then `{"id": 7}` are the same row (a string column stores "7").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_keys_are_read_after_coercion() -> Result<()> {
    let (ws, config) = workspace_with("coerced", |p| {
        p.upsert(&["id"]).schema("on_incompatible", "coerce")
    })?;
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, None, vec![None])]);
    p.push(messages("t", 0, 0, &[Some(r#"{"id": "7", "v": "first"}"#)]));
    p.stop().await??;
    let p = ScriptedPipeline::start(&config).await?;
    p.assign("t", &[(0, Some(1), vec![Some(1)])]);
    p.push(messages("t", 0, 1, &[Some(r#"{"id": 7, "v": "second"}"#)]));
    p.stop().await??;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "coerced", "id")?;
        assert_eq!(dump.rows().len(), 1, "{reader}: one live row for key 7");
        assert_eq!(dump.rows()[0]["id"], "7", "{reader}");
        assert_eq!(dump.rows()[0]["v"], "second", "{reader}");
    }
    Ok(())
}
