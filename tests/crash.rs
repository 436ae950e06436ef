//! Exactly-once across SIGKILL: the agent is killed at three points of a commit and
//! restarted; the readers must see every record exactly once.

use std::time::Duration;

use anyhow::Result;
use floe::failpoint::{AFTER_COMMIT, AFTER_WRITE, BEFORE_WRITE};
use floe_tests::{AgentProcess, Broker, PipelineSpec, Workspace};
use serde_json::json;

const PER_ROUND: i64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_each_commit_stage_neither_loses_nor_duplicates() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 3).await?;
    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "orders",
        bootstrap: &broker.bootstrap,
        topic: "orders",
        namespace: "shop",
        table: "orders",
        commit_interval: "1s",
    })?;

    for (round, point) in [BEFORE_WRITE, AFTER_WRITE, AFTER_COMMIT]
        .into_iter()
        .enumerate()
    {
        let round = round as i64;
        let batch: Vec<_> = (round * PER_ROUND..(round + 1) * PER_ROUND)
            .map(|i| {
                (
                    Some(format!("k{}", i % 10).into_bytes()),
                    Some(json!({"id": i, "round": round}).to_string().into_bytes()),
                )
            })
            .collect();
        broker.produce("orders", &batch).await?;

        let mut agent = AgentProcess::start_at_failpoint(&config, point, &[])?;
        agent.wait_for_failpoint(Duration::from_secs(90))?;
        agent.kill9()?;
        let after_kill = ws.committed_rows("shop", "orders").await?;
        let expected_after_kill = if point == AFTER_COMMIT {
            (round + 1) * PER_ROUND
        } else {
            round * PER_ROUND
        };
        assert_eq!(
            after_kill, expected_after_kill,
            "rows committed when killed at {point}"
        );

        let agent = AgentProcess::start(&config, &[])?;
        ws.wait_for_rows(
            "shop",
            "orders",
            (round + 1) * PER_ROUND,
            Duration::from_secs(90),
        )
        .await?;
        // Give a duplicate every chance to show up: wait until the table covers every
        // message produced (the agent read to the end), then a few commit intervals.
        let catalog = ws.catalog().await?;
        floe_tests::wait_for_messages(
            catalog.as_ref(),
            "shop",
            "orders",
            "orders",
            (round + 1) * PER_ROUND,
            Duration::from_secs(60),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        agent.terminate()?;
        assert_eq!(
            ws.committed_rows("shop", "orders").await?,
            (round + 1) * PER_ROUND,
            "after restart from {point}"
        );
    }

    // Every value of every row, against what the topic holds.
    floe_tests::reference::assert_append_table(
        &broker.bootstrap,
        "orders",
        (3 * PER_ROUND) as usize,
        "orders",
        |r| ws.read(r, "shop", "orders", "id"),
    )?;
    Ok(())
}

/// SIGKILL with files half written on S3 (REST catalog, vended credentials): some files
/// rolled and complete but not committed, one open with row groups written. After a
/// restart every value of every row is exact, and orphan cleanup on S3 removes what the
/// killed agent left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_files_half_written_on_s3() -> Result<()> {
    let lake = floe_tests::lake::Lake::rest()?;
    let broker = Broker::start()?;
    broker.create_topic("orders", 2).await?;
    let config = |interval: &str| {
        lake.config().pipeline(
            lake.pipeline("orders", &broker.bootstrap, "orders", "orders")
                .set("sink.target_file_size", "128KiB")
                .set("sink.row_group_bytes", "64KiB")
                .commit_interval(interval),
        )
    };
    // The killed run never reaches its first commit; the restarted one commits often.
    let slow = lake.write("slow.toml", &config("600s"))?;
    let config = lake.write("floe.toml", &config("1s"))?;
    let batch = |range: std::ops::Range<i64>| -> Vec<floe_tests::Message> {
        range
            .map(|i| {
                let v = json!({"id": i, "customer": format!("c{}", i * 7919 % 10_007), "note": format!("{:x}", (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))});
                (Some(format!("k{}", i % 10).into_bytes()), Some(v.to_string().into_bytes()))
            })
            .collect()
    };
    for start in (0..30_000).step_by(2_000) {
        broker
            .produce("orders", &batch(start..start + 2_000))
            .await?;
    }

    let mut agent =
        AgentProcess::start_at_failpoint(&slow, AFTER_WRITE, &[("FLOE_FAILPOINT_SKIP", "3")])?;
    agent.wait_for_failpoint(Duration::from_secs(90))?;
    agent.kill9()?;

    let agent = AgentProcess::start(&config, &[])?;
    broker.produce("orders", &batch(30_000..32_000)).await?;
    lake.wait_for_messages("orders", "orders", 32_000).await?;
    agent.terminate()?;

    let table = lake.table("orders").await?;
    let reload = || async { Ok(table.clone()) };
    let report =
        floe_iceberg::orphans::remove_orphans(&table, reload, Duration::ZERO, false).await?;
    println!("orphan cleanup on S3 after the kill: {report}");
    anyhow::ensure!(
        !report.starts_with("deleted 0 "),
        "the killed agent's files were not found: {report}"
    );

    floe_tests::reference::assert_append_table(
        &broker.bootstrap,
        "orders",
        32_000,
        "orders",
        |r| lake.read(r, "orders", "id"),
    )?;
    Ok(())
}
