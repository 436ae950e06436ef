//! Malformed messages go to the dead-letter file with their bytes, and to the
//! dead-letter topic with their key, value, own headers and the reason in headers; the
//! pipeline keeps running.

use std::time::Duration;

use anyhow::Result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{Broker, Workspace, spawn_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_dead_lettered_and_good_ones_committed() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("mixed", 1).await?;
    broker.create_topic("mixed.dlq", 1).await?;
    let values: Vec<&[u8]> = vec![
        br#"{"id": 0, "name": "a"}"#,
        b"this is not json",
        br#"[1, 2, 3]"#,
        br#"{"id": 3, "name": "b"}"#,
        br#"{"id": "three", "name": "c"}"#,
        b"\xff\xfe\x00binary",
        br#"{"id": 6, "name": "d"}"#,
    ];
    let batch: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (Some(format!("key-{i}").into_bytes()), Some(v.to_vec())))
        .collect();
    // Records carry headers of their own, which the dead-letter topic keeps.
    let own_headers: [(&str, &[u8]); 2] = [("trace-id", b"t-42"), ("raw", b"\x00\xff")];
    floe_tests::produce_with_headers(&broker.bootstrap, "mixed", &batch, &own_headers).await?;

    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("mixed", &broker.bootstrap, "mixed")
                .table("ns", "mixed")
                .dead_letter_topic("mixed.dlq"),
        ),
    )?;
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

    // The topic holds the same records: original key and value, the file's reason.
    let topic = read_dead_letter_topic(&broker.bootstrap, "mixed.dlq", letters.len())?;
    assert_eq!(topic.len(), letters.len(), "{topic:?}");
    for (t, l) in topic.iter().zip(&letters) {
        let value = B64.decode(l.value_base64.as_deref().unwrap_or_default())?;
        assert_eq!(t.value.as_deref(), Some(value.as_slice()));
        assert_eq!(t.key, Some(format!("key-{}", l.offset).into_bytes()));
        let h = |k: &str| {
            t.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("floe.error.stage"), Some(l.stage.as_str()));
        assert_eq!(h("floe.error.reason"), Some(l.reason.as_str()));
        assert_eq!(h("floe.error.topic"), Some("mixed"));
        assert_eq!(h("floe.error.partition"), Some("0"));
        assert_eq!(h("floe.error.offset"), Some(l.offset.to_string().as_str()));
        assert_eq!(h("floe.error.pipeline"), Some("mixed"));
        assert_eq!(
            t.raw_headers[..2],
            own_headers.map(|(k, v)| (k.to_string(), v.to_vec())),
            "the record's own headers come first, unchanged"
        );
    }
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

/// `file = false`: dead letters go to the topic only (a pod with a read-only or
/// ephemeral disk); no file is written, and the topic holds each bad record's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_go_to_the_topic_only() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("few", 1).await?;
    broker.create_topic("few.dlq", 1).await?;
    let values: Vec<&[u8]> = vec![br#"{"id": 0}"#, b"not json", br#"{"id": 2}"#, b"[]"];
    let batch: Vec<_> = values.iter().map(|v| (None, Some(v.to_vec()))).collect();
    broker.produce("few", &batch).await?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("few", &broker.bootstrap, "few")
                .table("ns", "few")
                .dead_letter_topic("few.dlq")
                .set("dead_letter.file", false),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "few", 2, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    let topic = read_dead_letter_topic(&broker.bootstrap, "few.dlq", 2)?;
    let got: Vec<Option<&[u8]>> = topic.iter().map(|t| t.value.as_deref()).collect();
    assert_eq!(got, [Some(values[1]), Some(values[3])]);
    assert!(
        !ws.path("dead-letter.ndjson").exists(),
        "a dead-letter file was written"
    );
    Ok(())
}

/// A dead-letter topic that does not take a letter (here: larger than the producer's
/// `message.max.bytes`) costs a warning, not the pipeline: the letter is in the file,
/// the good rows are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_that_refuses_falls_back_to_the_file() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("lost", 1).await?;
    broker.create_topic("lost.dlq", 1).await?;
    let big = format!("not json {}", "x".repeat(8000));
    let values: Vec<&[u8]> = vec![br#"{"id": 0}"#, big.as_bytes(), br#"{"id": 2}"#];
    let batch: Vec<_> = values.iter().map(|v| (None, Some(v.to_vec()))).collect();
    broker.produce("lost", &batch).await?;
    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("lost", &broker.bootstrap, "lost")
                .table("ns", "lost")
                .dead_letter_topic("lost.dlq")
                .set(
                    "source.properties",
                    toml::Value::Table(toml::map::Map::from_iter([(
                        "message.max.bytes".to_string(),
                        toml::Value::String("4000".into()),
                    )])),
                ),
        ),
    )?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ns", "lost", 2, Duration::from_secs(90))
        .await?;
    agent.stop().await?;
    let file = std::fs::read_to_string(ws.path("dead-letter.ndjson"))?;
    assert_eq!(file.lines().count(), 1, "{file}");
    assert!(file.contains(&B64.encode(values[1])), "{file}");
    Ok(())
}

/// A record read from the dead-letter topic.
#[derive(Debug)]
struct TopicLetter {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, String)>,
    raw_headers: Vec<(String, Vec<u8>)>,
}

/// Reads partition 0 of `topic` from the start until `n` records arrived (30 s at most).
fn read_dead_letter_topic(bootstrap: &str, topic: &str, n: usize) -> Result<Vec<TopicLetter>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "dlq-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n && std::time::Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m?;
        let headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (
                            h.key.to_string(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let raw_headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(TopicLetter {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
            raw_headers,
        });
    }
    Ok(out)
}

/// A SIGKILL after an interval's dead letters reached the topic and before the commit
/// that moves the offsets past them: nothing is lost. The restarted agent reads those
/// records again and sends their dead letters once more (a dead letter may repeat,
/// never go missing); the table holds every good record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_dead_letter_and_commit_loses_no_dead_letter() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 1).await?;
    broker.create_topic("orders.dlq", 1).await?;
    let batch: Vec<_> = (0..40)
        .map(|i| {
            let value = if i % 8 == 3 {
                format!("not json {i}").into_bytes()
            } else {
                format!(r#"{{"id": {i}, "note": "n{i}"}}"#).into_bytes()
            };
            (Some(format!("key-{i}").into_bytes()), Some(value))
        })
        .collect();
    broker.produce("orders", &batch).await?;
    let bad: Vec<i64> = (0..40).filter(|i| i % 8 == 3).collect();

    let ws = Workspace::new()?;
    let config = ws.write(
        &ws.config().pipeline(
            ws.pipeline("orders", &broker.bootstrap, "orders")
                .table("ns", "orders")
                .dead_letter_topic("orders.dlq"),
        ),
    )?;
    let mut agent = floe_tests::AgentProcess::start_at_failpoint(
        &config,
        floe::failpoint::AFTER_DEAD_LETTERS,
        &[],
    )?;
    agent.wait_for_failpoint(Duration::from_secs(90))?;
    // Acknowledged by the broker before the commit: on the topic already.
    let before = read_dead_letter_topic(&broker.bootstrap, "orders.dlq", bad.len())?;
    let offsets = |letters: &[TopicLetter]| -> Vec<i64> {
        let mut o: Vec<i64> = letters
            .iter()
            .map(|l| {
                let h = l.headers.iter().find(|(n, _)| n == "floe.error.offset");
                h.map(|(_, v)| v.parse().unwrap()).unwrap()
            })
            .collect();
        o.sort();
        o
    };
    assert_eq!(offsets(&before), bad, "dead letters before the kill");
    agent.kill9()?;
    assert_eq!(
        ws.committed_rows("ns", "orders").await?,
        0,
        "nothing committed"
    );

    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("ns", "orders", 35, Duration::from_secs(90))
        .await?;
    agent.terminate()?;
    let after = read_dead_letter_topic(&broker.bootstrap, "orders.dlq", 2 * bad.len())?;
    let mut repeated = bad.clone();
    repeated.extend(&bad);
    repeated.sort();
    assert_eq!(
        offsets(&after),
        repeated,
        "each dead letter sent again, none lost"
    );
    for l in &after {
        let offset = l
            .headers
            .iter()
            .find(|(n, _)| n == "floe.error.offset")
            .map(|(_, v)| v.parse::<usize>().unwrap())
            .unwrap();
        assert_eq!(l.value.as_deref(), batch[offset].1.as_deref());
        assert_eq!(l.key.as_deref(), batch[offset].0.as_deref());
    }
    let dump = ws.read("pyiceberg", "ns", "orders", "id")?;
    let rows: Vec<(i64, String)> = dump
        .rows()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["note"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(i64, String)> = (0..40)
        .filter(|i| i % 8 != 3)
        .map(|i| (i, format!("n{i}")))
        .collect();
    assert_eq!(rows, expected);
    Ok(())
}
