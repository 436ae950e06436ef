//! Append mode end to end: a real broker, the agent, and two independent readers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use floe_tests::lake::WAIT;
use floe_tests::{
    Broker, Pipeline, Transform, Workspace, free_port, metric_value, scrape_metrics, spawn_agent,
};
use serde_json::{Value, json};

const N: i64 = 10_000;

fn at(i: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_700_000_000 + i, (i as u32 % 1000) * 1000)
        .expect("valid time")
}

fn message(i: i64) -> Value {
    json!({
        "id": i,
        "user": format!("user-{}", i % 97),
        "amount": i as f64 * 0.5 + 0.25,
        "paid": i % 2 == 0,
        "at": at(i).to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "tags": [format!("t{}", i % 3), "x"],
        "geo": {"lat": 10.5, "lon": (i % 180) as f64},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_json_messages_reach_both_readers_and_new_fields_add_columns() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("events", 4).await?;
    let batch: Vec<_> = (0..N)
        .map(|i| {
            (
                Some(format!("user-{}", i % 97).into_bytes()),
                Some(message(i).to_string().into_bytes()),
            )
        })
        .collect();
    broker.produce("events", &batch).await?;

    let ws = Workspace::new()?;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let config = ws.write(
        &ws.config().metrics(&metrics_addr).pipeline(
            ws.pipeline("events", &broker.bootstrap, "events")
                .table("demo", "events"),
        ),
    )?;
    let started = Instant::now();
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("demo", "events", N, Duration::from_secs(120))
        .await?;
    let elapsed = started.elapsed();
    println!(
        "end-to-end: {N} messages committed in {:.2}s = {:.0} msg/s (agent start to last commit, 1s commit interval)",
        elapsed.as_secs_f64(),
        N as f64 / elapsed.as_secs_f64()
    );

    // A second batch brings a new field: it becomes a column, older rows read it as null.
    let extra: Vec<_> = (N..N + 100)
        .map(|i| {
            let mut m = message(i);
            m["coupon"] = json!(format!("C{i}"));
            (
                Some(format!("user-{}", i % 97).into_bytes()),
                Some(m.to_string().into_bytes()),
            )
        })
        .collect();
    broker.produce("events", &extra).await?;
    ws.wait_for_rows("demo", "events", N + 100, Duration::from_secs(60))
        .await?;

    // The figures users alert on. Lag comes from librdkafka statistics (every 5s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let m = scrape_metrics(&metrics_addr)?;
        let lag_reported = (0..4).all(|p| {
            metric_value(&m, "floe_consumer_lag", &[&format!("partition=\"{p}\"")]) == Some(0.0)
        });
        if lag_reported || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pipeline = "pipeline=\"events\"";
    assert_eq!(
        metric_value(&metrics, "floe_records_in_total", &[pipeline]),
        Some((N + 100) as f64),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "floe_records_out_total", &[pipeline]),
        Some((N + 100) as f64),
        "{metrics}"
    );
    let since = metric_value(&metrics, "floe_seconds_since_last_commit", &[pipeline])
        .expect("seconds since last commit");
    assert!(since < 30.0, "{since}");
    for p in 0..4 {
        let lag = metric_value(
            &metrics,
            "floe_consumer_lag",
            &[pipeline, &format!("partition=\"{p}\"")],
        );
        assert_eq!(
            lag,
            Some(0.0),
            "partition {p} lag once everything is read:\n{metrics}"
        );
    }
    agent.stop().await?;

    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "demo", "events", "id")?;
        let rows = dump.rows();
        assert_eq!(rows.len() as i64, N + 100, "{reader}: row count");
        let columns = dump.columns();
        for c in [
            "_kafka_partition",
            "_kafka_offset",
            "_kafka_timestamp",
            "_kafka_key",
            "id",
            "user",
            "amount",
            "paid",
            "at",
            "tags",
            "geo",
            "coupon",
        ] {
            assert!(
                columns.iter().any(|x| x == c),
                "{reader}: column {c} missing from {columns:?}"
            );
        }
        let mut last_offset_per_key: HashMap<String, (i64, i64)> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            let i = i as i64;
            let expected = message(i);
            assert_eq!(row["id"], json!(i), "{reader}: ids are 0..N, each once");
            for field in ["user", "amount", "paid", "tags"] {
                assert_eq!(
                    row[field], expected[field],
                    "{reader}: row {i} field {field}"
                );
            }
            assert_eq!(
                row["geo"]["lon"], expected["geo"]["lon"],
                "{reader}: row {i} nested field"
            );
            let at_read =
                chrono::DateTime::parse_from_rfc3339(row["at"].as_str().expect("at is a string"))
                    .expect("timestamp");
            assert_eq!(at_read, at(i), "{reader}: row {i} timestamp");
            assert_eq!(row["_kafka_key"], expected["user"], "{reader}: key column");
            assert!(
                row["_kafka_timestamp"].is_string(),
                "{reader}: Kafka timestamp present"
            );
            let partition = row["_kafka_partition"].as_i64().expect("partition");
            assert!((0..4).contains(&partition));
            let offset = row["_kafka_offset"].as_i64().expect("offset");
            // Same key, same partition, offsets in production order.
            let key = row["_kafka_key"].as_str().expect("key").to_string();
            if let Some((p, o)) = last_offset_per_key.insert(key, (partition, offset)) {
                assert_eq!(p, partition, "{reader}: one partition per key");
                assert!(offset > o, "{reader}: offsets grow in production order");
            }
            if i < N {
                assert!(
                    row["coupon"].is_null(),
                    "{reader}: old rows read the new column as null"
                );
            } else {
                assert_eq!(
                    row["coupon"],
                    json!(format!("C{i}")),
                    "{reader}: new column"
                );
            }
        }
        println!(
            "{reader}: {} rows, {} snapshots",
            rows.len(),
            dump.snapshot_count()
        );
    }
    Ok(())
}

/// `table = "raw_{topic}"`: each listed topic lands in its own table, every value of
/// every row right, and each table stores the offsets of its topic. With
/// `sink.location`, the tables are created under it, outside the catalog's warehouse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_per_topic_holds_exactly_its_topics_records() -> Result<()> {
    let broker = Broker::start()?;
    let topics = ["orders.eu", "orders-us"];
    for t in topics {
        broker.create_topic(t, 2).await?;
    }
    let lake = floe_tests::lake::Lake::embedded()?;
    let pipeline = lake
        .pipeline("split", &broker.bootstrap, "orders.eu", "raw_{topic}")
        .topics(&topics)
        .set(
            "sink.location",
            format!("{}/", lake.ws.path("elsewhere").display()),
        );
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let mut counts = Vec::new();
    for (i, t) in topics.iter().enumerate() {
        let n = 200 + 100 * i as i64;
        let batch: Vec<_> = (0..n)
            .map(|k| {
                let v = json!({"id": k, "region": t, "amount": k as f64 / 8.0});
                (
                    Some(format!("c{}", k % 5).into_bytes()),
                    Some(v.to_string().into_bytes()),
                )
            })
            .collect();
        broker.produce(t, &batch).await?;
        counts.push(n);
    }
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("raw_orders_eu", "split", counts[0])
        .await?;
    lake.wait_for_messages("raw_orders_us", "split", counts[1])
        .await?;
    agent.terminate()?;
    for ((t, table), n) in topics
        .iter()
        .zip(["raw_orders_eu", "raw_orders_us"])
        .zip(&counts)
    {
        let location = lake.table(table).await?.metadata().location().to_string();
        let want = lake.ws.path(&format!("elsewhere/{table}"));
        assert_eq!(
            floe_iceberg::orphans::local_dir(&location),
            Some(want),
            "{table} is not under sink.location"
        );
        floe_tests::reference::assert_append_table(
            &broker.bootstrap,
            t,
            *n as usize,
            table,
            |r| lake.read(r, table, "id"),
        )?;
    }
    Ok(())
}

/// A pipeline reading every topic matching `pattern` into `table` (`{topic}` names a
/// table per topic), finding new topics within a second.
fn pattern_pipeline(
    lake: &floe_tests::lake::Lake,
    name: &str,
    bootstrap: &str,
    pattern: &str,
    table: &str,
) -> Pipeline {
    lake.pipeline(name, bootstrap, "placeholder", table)
        .topic_pattern(pattern)
        .property("topic.metadata.refresh.interval.ms", "1000")
}

/// Twenty topics of one pattern, the last created while the agent runs: twenty tables,
/// each holding exactly its topic's records, every column through both readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_topics_of_a_pattern_become_twenty_tables() -> Result<()> {
    const TOPICS: i64 = 20;
    const RECORDS: i64 = 30;
    let broker = Broker::start()?;
    let topic = |i: i64| format!("feed.t{i:02}");
    let records = |i: i64| -> Vec<floe_tests::Message> {
        (0..RECORDS)
            .map(|k| {
                let v = json!({"id": k, "source": i, "amount": (i * 100 + k) as f64 / 8.0});
                (
                    Some(format!("k{k}").into_bytes()),
                    Some(v.to_string().into_bytes()),
                )
            })
            .collect()
    };
    for i in 0..TOPICS - 1 {
        broker.create_topic(&topic(i), 1).await?;
        broker.produce(&topic(i), &records(i)).await?;
    }
    let lake = floe_tests::lake::Lake::embedded()?;
    let pipeline = pattern_pipeline(
        &lake,
        "feeds",
        &broker.bootstrap,
        r"feed\..*",
        "raw_{topic}",
    );
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    let table = |i: i64| format!("raw_feed_t{i:02}");
    for i in 0..TOPICS - 1 {
        lake.wait_for_messages(&table(i), "feeds", RECORDS).await?;
    }
    broker.create_topic(&topic(TOPICS - 1), 1).await?;
    broker
        .produce(&topic(TOPICS - 1), &records(TOPICS - 1))
        .await?;
    lake.wait_for_messages(&table(TOPICS - 1), "feeds", RECORDS)
        .await?;
    agent.terminate()?;
    let namespace_tables = lake
        .catalog()
        .await?
        .list_tables(&iceberg::NamespaceIdent::new(lake.namespace.clone()))
        .await?;
    ensure!(
        namespace_tables.len() == TOPICS as usize,
        "{} tables: {namespace_tables:?}",
        namespace_tables.len()
    );
    for i in 0..TOPICS {
        floe_tests::reference::assert_append_table(
            &broker.bootstrap,
            &topic(i),
            RECORDS as usize,
            &table(i),
            |r| lake.read(r, &table(i), "id"),
        )?;
    }
    Ok(())
}

/// `topic_pattern` with `table = "raw_{topic}"`: every matching topic gets its table,
/// one created while the agent runs too; a table stores only its own topic's offsets,
/// so after a restart each table resumes where it stopped and a quiet topic's table gets
/// no snapshot. Every value of every row is compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_pattern_adds_a_table_per_topic_as_topics_appear() -> Result<()> {
    let broker = Broker::start()?;
    for (t, partitions) in [("shop.a", 2), ("shop.b", 1), ("misc", 1)] {
        broker.create_topic(t, partitions).await?;
    }
    let records = |topic: &str, from: i64, n: i64| -> Vec<floe_tests::Message> {
        (from..from + n)
            .map(|k| {
                let v = json!({"id": k, "topic": topic, "amount": k as f64 / 4.0});
                (
                    Some(format!("k{}", k % 7).into_bytes()),
                    Some(v.to_string().into_bytes()),
                )
            })
            .collect()
    };
    // The last record of a topic in a batch of its own: Tansu reports the end of a
    // partition as the last batch's first offset + 1, and a restart checks the ends.
    let produce = |topic: &'static str, from: i64, n: i64| {
        let broker = &broker;
        let records = &records;
        async move {
            broker.produce(topic, &records(topic, from, n - 1)).await?;
            broker
                .produce(topic, &records(topic, from + n - 1, 1))
                .await
        }
    };
    produce("shop.a", 0, 200).await?;
    produce("shop.b", 0, 100).await?;
    produce("misc", 0, 50).await?;
    let lake = floe_tests::lake::Lake::embedded()?;
    let pipeline = pattern_pipeline(
        &lake,
        "split",
        &broker.bootstrap,
        r"shop\..*",
        "raw_{topic}",
    );
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("raw_shop_a", "split", 200).await?;
    lake.wait_for_messages("raw_shop_b", "split", 100).await?;
    // A topic created while running gets its table at the next metadata refresh.
    broker.create_topic("shop.c", 1).await?;
    produce("shop.c", 0, 80).await?;
    lake.wait_for_messages("raw_shop_c", "split", 80).await?;
    agent.terminate()?;
    for (table, topic) in [
        ("raw_shop_a", "shop.a"),
        ("raw_shop_b", "shop.b"),
        ("raw_shop_c", "shop.c"),
    ] {
        let t = lake.table(table).await?;
        let offsets = floe_iceberg::OffsetMap::from_table(t.metadata(), "split")?;
        let topics: Vec<&str> = offsets.0.keys().map(|tp| &*tp.0).collect();
        if topics.iter().any(|t| *t != topic) {
            bail!("{table} stores offsets of {topics:?}, expected only {topic}");
        }
    }
    if lake.table("raw_misc").await.is_ok() {
        bail!("a table was created for topic misc, which does not match the pattern");
    }

    // A restart with records for one topic only: that table continues where it stopped,
    // the others are not touched.
    let quiet = lake
        .table("raw_shop_b")
        .await?
        .metadata()
        .current_snapshot_id();
    produce("shop.a", 200, 50).await?;
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("raw_shop_a", "split", 250).await?;
    agent.terminate()?;
    let after = lake
        .table("raw_shop_b")
        .await?
        .metadata()
        .current_snapshot_id();
    if after != quiet {
        bail!("the quiet topic's table got a new snapshot: {quiet:?} -> {after:?}");
    }
    for (topic, n) in [("shop.a", 250), ("shop.b", 100), ("shop.c", 80)] {
        let table = format!("raw_{}", topic.replace('.', "_"));
        floe_tests::reference::assert_append_table(&broker.bootstrap, topic, n, &table, |r| {
            lake.read(r, &table, "id")
        })?;
    }
    Ok(())
}

/// Messages of nearly a megabyte (the broker's default limit) among small ones: they
/// flow through decode and the writer, every value exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_nearly_a_megabyte_land_whole() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("big", 1).await?;
    let lake = floe_tests::lake::Lake::embedded()?;
    let config = lake.write(
        "floe.toml",
        &lake
            .config()
            .pipeline(lake.pipeline("big", &broker.bootstrap, "big", "big")),
    )?;
    let batch: Vec<_> = (0..24i64)
        .map(|i| {
            let size = if i % 3 == 0 { 900_000 } else { 40 };
            let text: String = (0..size)
                .map(|k| char::from(b'a' + ((k * 7 + i as usize) % 26) as u8))
                .collect();
            let v = json!({"id": i, "doc": text});
            (None, Some(v.to_string().into_bytes()))
        })
        .collect();
    for chunk in batch.chunks(4) {
        broker.produce("big", chunk).await?;
    }
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("big", "big", 24).await?;
    agent.terminate()?;
    floe_tests::reference::assert_append_table(&broker.bootstrap, "big", 24, "big", |r| {
        lake.read(r, "big", "id")
    })?;
    Ok(())
}

/// Messages of 10 MB (ten times the broker's default limit; the producer allows more)
/// among small ones, through a passthrough plugin, decode and the writer: every value
/// exact. The agent's own bounds (source events, plugin batches, chunks, row groups)
/// are in bytes, and a record larger than one of them travels alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_ten_megabytes_pass_a_plugin_and_land_whole() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("huge", 1).await?;
    let lake = floe_tests::lake::Lake::embedded()?;
    let pipeline = lake
        .pipeline("huge", &broker.bootstrap, "huge", "huge")
        .transform(Transform::new(floe_tests::plugin_path("passthrough")));
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let batch: Vec<_> = (0..9i64)
        .map(|i| {
            let size = if i % 3 == 1 { 10_000_000 } else { 100 };
            let text: String = (0..size)
                .map(|k| char::from(b'a' + ((k * 11 + i as usize) % 26) as u8))
                .collect();
            let v = json!({"id": i, "doc": text});
            (None, Some(v.to_string().into_bytes()))
        })
        .collect();
    for record in batch.chunks(1) {
        broker.produce("huge", record).await?;
    }
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("huge", "huge", 9).await?;
    agent.terminate()?;
    floe_tests::reference::assert_append_table(&broker.bootstrap, "huge", 9, "huge", |r| {
        lake.read(r, "huge", "id")
    })?;
    Ok(())
}

/// `topic_pattern` into one table: rows carry `_kafka_topic` (on by default when topics
/// share a table) and, with `headers_column`, their record headers; a topic created
/// while the agent runs is picked up, and binary keys are stored as base64
/// (`key_format = "base64"`) instead of dead-lettered. Every column of every row is
/// compared, rows told apart by topic, partition and offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_pattern_shares_a_table_with_the_topic_in_each_row() -> Result<()> {
    use base64::Engine as _;
    let broker = Broker::start()?;
    let first = ["events.web", "events.app"];
    let late = "events.pos";
    for t in first {
        broker.create_topic(t, 2).await?;
    }
    broker.create_topic("other", 1).await?;
    let lake = floe_tests::lake::Lake::embedded()?;
    let pipeline = pattern_pipeline(&lake, "all", &broker.bootstrap, r"^events\..*", "events")
        .set("sink.headers_column", true)
        .key_format("base64");
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let batch = |topic: &str, n: i64| -> Vec<floe_tests::Message> {
        (0..n)
            .map(|k| {
                let v = json!({"id": k, "source": topic, "score": k as f64 / 4.0});
                // Keys that are not UTF-8 (0xff never is).
                (
                    Some(vec![0xff, k as u8, 0x00]),
                    Some(v.to_string().into_bytes()),
                )
            })
            .collect()
    };
    let mut counts = vec![(first[0], 150), (first[1], 120)];
    // The first topics' records carry headers (a repeated name keeps its last value).
    let headers: [(&str, &[u8]); 3] = [("trace", b"t-1"), ("bin", b"\x00\xff"), ("trace", b"t-2")];
    for (t, n) in &counts {
        floe_tests::produce_with_headers(&broker.bootstrap, t, &batch(t, *n), &headers).await?;
    }
    broker.produce("other", &batch("other", 30)).await?;
    let agent = floe_tests::AgentProcess::start(&config, &[])?;
    if let Err(e) = lake.wait_for_messages("events", "all", 270).await {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    broker.create_topic(late, 1).await?;
    broker.produce(late, &batch(late, 40)).await?;
    counts.push((late, 40));
    if let Err(e) = lake.wait_for_messages("events", "all", 310).await {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    agent.terminate()?;

    let mut expected = Vec::new();
    for (t, n) in &counts {
        let records = floe_tests::reference::read_topic(&broker.bootstrap, t, *n as usize, WAIT)?;
        for (row, record) in floe_tests::reference::append_rows(&records)
            .into_iter()
            .zip(&records)
        {
            let mut row = row;
            let key = base64::engine::general_purpose::STANDARD
                .encode(record.key.as_deref().unwrap_or_default());
            row["_kafka_key"] = Value::from(key);
            row["_kafka_topic"] = Value::from(*t);
            row["_kafka_headers"] = if *t == late {
                json!([])
            } else {
                json!([
                    {"key": "trace", "value": {"hex": "742d32"}},
                    {"key": "bin", "value": {"hex": "00ff"}},
                ])
            };
            expected.push(row);
        }
    }
    for reader in ["pyiceberg", "duckdb"] {
        floe_tests::reference::assert_rows(
            reader,
            &lake.read(
                reader,
                "events",
                "_kafka_topic,_kafka_partition,_kafka_offset",
            )?,
            &expected,
            &["_kafka_topic", "_kafka_partition", "_kafka_offset"],
            &[],
        )?;
    }
    let letters =
        floe::dead_letter::DeadLetterWriter::read_all(&lake.ws.path("dead-letter-all.ndjson"))
            .unwrap_or_default();
    assert!(letters.is_empty(), "{letters:?}");
    Ok(())
}
