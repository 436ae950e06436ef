//! Rows stream into data files; commits tick on the interval.
//!
//! In process (scripted source, real embedded catalog): upsert keys updated across files
//! streamed within one interval and across intervals keep one live row per key (format
//! v2 position deletes and v3 deletion vectors, both readers).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use floe_tests::scripted::{ScriptedPipeline, messages};
use floe_tests::{Config, Pipeline, Workspace, wait_for_messages};
use serde_json::{Value, json};

/// The config of the in-process pipeline `p` (topic `t` into `ns.t`, a commit every
/// 3s), its sink completed by `sink`.
fn config(ws: &Workspace, sink: impl FnOnce(Pipeline) -> Pipeline) -> Result<PathBuf> {
    let pipeline = Pipeline::new("p", "127.0.0.1:9", "t")
        .group_id("g")
        .sink("local", "ns", "t")
        .commit_interval("3s")
        .dead_letter(ws.path("p.ndjson"));
    Config::new()
        .catalog("local", ws.embedded_catalog())
        .pipeline(sink(pipeline))
        .write(ws.path("floe.toml"))
}

/// Keys updated several times within one interval (their versions in different
/// streamed files: small row groups make small chunks) and again in a later interval,
/// with deletes: one live row per key, the newest.
async fn upsert_across_files(format_version: u8) -> Result<()> {
    let ws = Workspace::new()?;
    let path = config(&ws, |p| {
        p.upsert(&["id"])
            .set("sink.format_version", i64::from(format_version))
            .set("sink.row_group_bytes", "64KiB")
    })?;
    let p = ScriptedPipeline::start(&path).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut offset = 0;
    let catalog = ws.catalog().await?;
    for interval in 0..3 {
        // Four rounds over 300 keys: each round is a few chunks, so every key's rows
        // are spread over the files of this interval.
        for round in 0..4 {
            let mut values = Vec::new();
            for id in 0..300i64 {
                let v =
                    json!({"id": id, "interval": interval, "round": round, "pad": "x".repeat(40)});
                values.push(v.to_string());
                reference.insert(id, v);
            }
            let refs: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
            p.push(messages("t", 0, offset, &refs));
            offset += refs.len() as i64;
        }
        wait_for_messages(
            catalog.as_ref(),
            "ns",
            "t",
            "p",
            offset,
            Duration::from_secs(60),
        )
        .await?;
    }
    p.stop().await??;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["ns", "t"])?)
        .await?;
    let snapshots = table.metadata().snapshots().count();
    assert!(
        (3..=5).contains(&snapshots),
        "one snapshot per interval (plus the table's first): {snapshots}"
    );
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "t", "id")?;
        let got: BTreeMap<i64, (i64, i64)> = dump
            .rows()
            .iter()
            .map(|r| {
                (
                    r["id"].as_i64().unwrap(),
                    (
                        r["interval"].as_i64().unwrap(),
                        r["round"].as_i64().unwrap(),
                    ),
                )
            })
            .collect();
        assert_eq!(dump.rows().len(), 300, "{reader}: one row per key");
        for (id, v) in &reference {
            let want = (
                v["interval"].as_i64().unwrap(),
                v["round"].as_i64().unwrap(),
            );
            assert_eq!(got.get(id), Some(&want), "{reader}: key {id}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_keys_updated_across_streamed_files_keep_one_row_v2() -> Result<()> {
    upsert_across_files(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_keys_updated_across_streamed_files_keep_one_row_v3() -> Result<()> {
    upsert_across_files(3).await
}

/// Deletes by tombstone (upsert keyed by the message key) across streamed files: a key
/// deleted, written again and deleted within one interval, and across intervals.
async fn tombstones_across_files(format_version: u8) -> Result<()> {
    let ws = Workspace::new()?;
    let path = config(&ws, |p| {
        p.upsert(&["_kafka_key"])
            .set("sink.format_version", i64::from(format_version))
            .set("sink.row_group_bytes", "64KiB")
    })?;
    let p = ScriptedPipeline::start(&path).await?;
    p.assign("t", &[(0, None, vec![None])]);
    let mut reference: BTreeMap<String, Option<Value>> = BTreeMap::new();
    let mut offset = 0;
    let catalog = ws.catalog().await?;
    let mut seq = 0u64;
    for interval in 0..3 {
        for round in 0..4 {
            let mut batch = Vec::new();
            for id in 0..200i64 {
                seq = seq
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("k{id}");
                let value = if (seq >> 33).is_multiple_of(4) {
                    None
                } else {
                    Some(
                        json!({"id": id, "interval": interval, "round": round, "pad": "y".repeat(40)}),
                    )
                };
                reference.insert(key.clone(), value.clone());
                batch.push(floe::record::Message {
                    topic: std::sync::Arc::from("t"),
                    partition: 0,
                    offset,
                    timestamp_ms: Some(1_700_000_000_000),
                    key: Some(key.into_bytes()),
                    value: value.map(|v| v.to_string().into_bytes()),
                    headers: Vec::new(),
                });
                offset += 1;
            }
            p.push(batch);
        }
        wait_for_messages(
            catalog.as_ref(),
            "ns",
            "t",
            "p",
            offset,
            Duration::from_secs(60),
        )
        .await?;
    }
    p.stop().await??;
    let live: BTreeMap<String, Value> = reference
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "t", "_kafka_key")?;
        let got: BTreeMap<String, (i64, i64)> = dump
            .rows()
            .iter()
            .map(|r| {
                (
                    r["_kafka_key"].as_str().unwrap().to_string(),
                    (
                        r["interval"].as_i64().unwrap(),
                        r["round"].as_i64().unwrap(),
                    ),
                )
            })
            .collect();
        assert_eq!(
            dump.rows().len(),
            live.len(),
            "{reader}: one row per live key"
        );
        for (k, v) in &live {
            let want = (
                v["interval"].as_i64().unwrap(),
                v["round"].as_i64().unwrap(),
            );
            assert_eq!(got.get(k), Some(&want), "{reader}: key {k}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_across_streamed_files_v2() -> Result<()> {
    tombstones_across_files(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_across_streamed_files_v3() -> Result<()> {
    tombstones_across_files(3).await
}

/// A partition revoked after some of its rows streamed into open files: those rows are
/// committed with the offsets they cover (the new owner starts after them), never
/// committed without them (the new owner would read them again: duplicates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_commits_its_streamed_rows_with_their_offsets() -> Result<()> {
    let ws = Workspace::new()?;
    let path = config(&ws, |p| p.set("sink.row_group_bytes", "64KiB"))?;
    let p = ScriptedPipeline::start(&path).await?;
    p.assign("t", &[(0, None, vec![None]), (1, None, vec![None])]);
    let values: Vec<String> = (0..2_000i64)
        .map(|id| json!({"id": id, "pad": "x".repeat(40)}).to_string())
        .collect();
    let refs: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
    // Partition 1's rows fill several chunks (they stream into an open file) before it
    // is revoked; partition 0 goes on.
    p.push(messages("t", 1, 0, &refs[..1_000]));
    p.drained(Duration::from_secs(10)).await?;
    p.revoke(vec![(std::sync::Arc::from("t"), 1)]);
    p.push(messages("t", 0, 0, &refs[1_000..]));
    p.stop().await??;

    let catalog = ws.catalog().await?;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["ns", "t"])?)
        .await?;
    let stored = floe_iceberg::OffsetMap::from_table(table.metadata(), "p")?;
    let stored_1 = stored.0.get(&(std::sync::Arc::from("t"), 1)).copied();
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "t", "id")?;
        let mut partition_1: Vec<i64> = dump
            .rows()
            .iter()
            .filter(|r| r["_kafka_partition"].as_i64() == Some(1))
            .map(|r| r["_kafka_offset"].as_i64().unwrap())
            .collect();
        partition_1.sort();
        // Exactly the offsets below the stored position: what the new owner skips.
        let expected: Vec<i64> = (0..stored_1.unwrap_or(0)).collect();
        assert_eq!(
            partition_1, expected,
            "{reader}: stored offset {stored_1:?}"
        );
        let rows = dump.rows();
        assert_eq!(rows.len() as i64, 1_000 + stored_1.unwrap_or(0), "{reader}");
        for r in rows {
            let id = r["id"].as_i64().unwrap();
            assert_eq!(r["pad"], json!("x".repeat(40)), "{reader}: row {id}");
            let (partition, offset) = if id < 1_000 { (1, id) } else { (0, id - 1_000) };
            assert_eq!(
                r["_kafka_partition"],
                json!(partition),
                "{reader}: row {id}"
            );
            assert_eq!(r["_kafka_offset"], json!(offset), "{reader}: row {id}");
        }
    }
    Ok(())
}
