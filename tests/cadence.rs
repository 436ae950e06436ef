//! Files roll, commits tick: a sustained stream through a real broker for more than
//! three commit intervals ends in one snapshot per interval (plus at most one at
//! shutdown), each snapshot's files at the target size except the one the commit
//! closed, and every value of every row exact (both readers, both catalogs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use floe_iceberg::manifests;
use floe_tests::lake::Lake;
use floe_tests::{AgentProcess, Broker};
use serde_json::json;

const INTERVAL_SECS: u64 = 4;
const TARGET: u64 = 128 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_snapshot_per_interval_with_files_at_the_target_size() -> Result<()> {
    sustained(Lake::embedded()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_snapshot_per_interval_with_files_at_the_target_size_on_the_rest_catalog() -> Result<()>
{
    sustained(Lake::rest()?).await
}

async fn sustained(lake: Lake) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("c", 2).await?;
    let pipeline = lake
        .pipeline("c", &broker.bootstrap, "c", "c")
        .set("sink.target_file_size", "128KiB")
        .set("sink.row_group_bytes", "64KiB")
        .commit_interval(&format!("{INTERVAL_SECS}s"));
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let agent = AgentProcess::start(&config, &[])?;
    let started = Instant::now();

    // About 6 MB of JSON a commit interval, for four intervals and a half.
    let mut n = 0i64;
    let producing = Instant::now();
    while producing.elapsed() < Duration::from_millis(INTERVAL_SECS * 4_500) {
        let batch: Vec<_> = (0..2_000)
            .map(|i| {
                let v = json!({
                    "n": n + i,
                    "name": format!("customer-{}", (n + i) * 7919 % 100_003),
                    "amount": ((n + i) % 9973) as f64 / 100.0,
                    "note": format!("{:x}", ((n + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                });
                (
                    Some(format!("k{}", (n + i) % 64).into_bytes()),
                    Some(v.to_string().into_bytes()),
                )
            })
            .collect();
        n += batch.len() as i64;
        broker.produce("c", &batch).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lake.wait_for_messages("c", "c", n).await?;
    let lifetime = started.elapsed();
    agent.terminate()?;

    let table = lake.table("c").await?;
    let snapshots: Vec<_> = table.metadata().snapshots().cloned().collect();
    let intervals = lifetime.as_secs() / INTERVAL_SECS;
    let current = table.metadata().current_snapshot().expect("a snapshot");
    let mut sizes: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for f in manifests::live_files(&table, current).await? {
        let snapshot = f.entry.snapshot_id().unwrap_or_default();
        sizes
            .entry(snapshot)
            .or_default()
            .push(f.entry.file_size_in_bytes());
    }
    println!(
        "{}: {n} records in {lifetime:?} ({intervals} intervals of {INTERVAL_SECS}s): {} snapshots; file sizes per snapshot: {sizes:?}",
        lake.kind(),
        snapshots.len()
    );
    ensure!(
        snapshots.len() as u64 <= intervals + 1,
        "{} snapshots in {intervals} commit intervals",
        snapshots.len()
    );
    ensure!(
        sizes.values().flatten().count() > snapshots.len(),
        "no file rolled at the target size: {sizes:?}"
    );
    for (snapshot, files) in &sizes {
        // One file per commit is closed by the commit itself; the others rolled.
        let small = files.iter().filter(|&&s| s < TARGET / 2).count();
        ensure!(
            small <= 1,
            "snapshot {snapshot}: {small} files under half the target size: {files:?}"
        );
        ensure!(
            files.iter().all(|&s| s < TARGET * 2),
            "snapshot {snapshot}: a file far over the target size: {files:?}"
        );
    }

    floe_tests::reference::assert_append_table(&broker.bootstrap, "c", n as usize, "c", |r| {
        lake.read(r, "c", "n")
    })?;
    Ok(())
}
