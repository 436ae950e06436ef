//! Malformed messages go to the dead-letter file with their bytes; the pipeline keeps running.

use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, PipelineSpec, Workspace, spawn_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_dead_lettered_and_good_ones_committed() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("mixed", 1).await?;
    let values: Vec<&[u8]> = vec![
        br#"{"id": 0, "name": "a"}"#,
        b"this is not json",
        br#"[1, 2, 3]"#,
        br#"{"id": 3, "name": "b"}"#,
        br#"{"id": "three", "name": "c"}"#,
        b"\xff\xfe\x00binary",
        br#"{"id": 6, "name": "d"}"#,
    ];
    let batch: Vec<_> = values.iter().map(|v| (None, Some(v.to_vec()))).collect();
    broker.produce("mixed", &batch).await?;

    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "mixed",
        bootstrap: &broker.bootstrap,
        topic: "mixed",
        namespace: "ns",
        table: "mixed",
        commit_interval: "1s",
    })?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "mixed", 3, Duration::from_secs(60))
        .await?;

    // The pipeline is still running: later good records are committed too.
    let more: Vec<_> = (7..10)
        .map(|i| {
            (
                None,
                Some(format!(r#"{{"id": {i}, "name": "later"}}"#).into_bytes()),
            )
        })
        .collect();
    broker.produce("mixed", &more).await?;
    ws.wait_for_rows("ns", "mixed", 6, Duration::from_secs(60))
        .await?;
    agent.stop().await?;

    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    let got: Vec<(i64, Vec<u8>, &str)> = letters
        .iter()
        .map(|l| {
            (
                l.offset,
                B64.decode(l.value_base64.as_deref().unwrap_or_default())
                    .unwrap(),
                l.stage.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, values[1].to_vec(), "decode"),
            (2, values[2].to_vec(), "decode"),
            (4, values[4].to_vec(), "schema"),
            (5, values[5].to_vec(), "decode"),
        ]
    );
    assert!(
        letters
            .iter()
            .all(|l| l.topic == "mixed" && l.partition == 0 && l.timestamp_ms.is_some())
    );
    assert!(
        letters[0].reason.contains("not valid JSON"),
        "{}",
        letters[0].reason
    );
    assert!(letters[1].reason.contains("array"), "{}", letters[1].reason);
    assert!(
        letters[2].reason.contains("field `id`: column is long"),
        "{}",
        letters[2].reason
    );

    let dump = ws.read("pyiceberg", "ns", "mixed", "id")?;
    let ids: Vec<i64> = dump
        .rows()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [0, 3, 6, 7, 8, 9]);
    let offsets: Vec<i64> = dump
        .rows()
        .iter()
        .map(|r| r["_kafka_offset"].as_i64().unwrap())
        .collect();
    assert_eq!(offsets, [0, 3, 6, 7, 8, 9]);
    Ok(())
}
