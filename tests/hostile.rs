//! Hostile input through real services: records that would crash the agent, crash-loop
//! it or fail a whole batch if mishandled are each dealt with on their own
//! (dead-lettered, or committed), the pipeline (and the other pipeline beside it) keeps
//! committing, the agent restarts fine and both readers read the table.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use floe::dead_letter::DeadLetterWriter;
use floe_tests::{AgentProcess, Broker, Pipeline, Registry, Workspace};
use serde_json::json;

/// The workspace's pipeline reading topic `name` into `hostile.NAME`.
fn pipeline(ws: &Workspace, name: &str, bootstrap: &str) -> Pipeline {
    ws.pipeline(name, bootstrap, name).table("hostile", name)
}

/// Writes the workspace's config with `pipeline`.
fn write(ws: &Workspace, pipeline: Pipeline) -> Result<PathBuf> {
    ws.write(&ws.config().pipeline(pipeline))
}

fn values(v: &[String]) -> Vec<floe_tests::Message> {
    v.iter()
        .map(|s| (None, Some(s.clone().into_bytes())))
        .collect()
}

/// The dead letters of `ws`, asserting they are exactly the records at `offsets`.
fn dead_lettered(ws: &Workspace, offsets: &[i64]) -> Result<Vec<floe::dead_letter::DeadLetter>> {
    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(
        letters.iter().map(|l| l.offset).collect::<Vec<_>>(),
        offsets,
        "{letters:?}"
    );
    Ok(letters)
}

/// Both readers see exactly the ids `expected`.
fn read_ids(ws: &Workspace, table: &str, expected: &[i64]) -> Result<()> {
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "hostile", table, "id")?;
        let ids: Vec<i64> = dump
            .rows()
            .iter()
            .map(|r| r["id"].as_i64().expect("id"))
            .collect();
        assert_eq!(ids, expected, "{reader} reads {table}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_nested_45_levels_deep_is_dead_lettered_and_the_agent_restarts() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("deep", 1).await?;
    let mut deep = String::from("1");
    for _ in 0..45 {
        deep = format!("{{\"a\":{deep}}}");
    }
    let batch = values(&[
        json!({"id": 0}).to_string(),
        format!("{{\"id\":1,\"deep\":{deep}}}"),
        json!({"id": 2}).to_string(),
    ]);
    broker.produce("deep", &batch).await?;
    let ws = Workspace::new()?;
    let config = write(&ws, pipeline(&ws, "deep", &broker.bootstrap))?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "deep", 2, Duration::from_secs(60))
        .await?;
    agent.terminate()?;

    // The table's metadata is still loadable: the agent starts again and goes on.
    let agent = AgentProcess::start(&config, &[])?;
    broker
        .produce("deep", &values(&[json!({"id": 3}).to_string()]))
        .await?;
    ws.wait_for_rows("hostile", "deep", 3, Duration::from_secs(60))
        .await?;
    agent.terminate()?;
    let letters = DeadLetterWriter::read_all(&ws.path("dead-letter.ndjson"))?;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].offset, 1);
    assert!(letters[0].reason.contains("deep"), "{}", letters[0].reason);
    read_ids(&ws, "deep", &[0, 2, 3])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_colliding_full_name_in_one_of_two_pipelines_is_dead_lettered_and_both_commit()
-> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("ecs", 1).await?;
    broker.create_topic("plain", 1).await?;
    broker
        .produce(
            "ecs",
            &values(&[
                json!({"id": 0, "host": {"name": "a"}}).to_string(),
                r#"{"id":1,"host":{"name":"a"},"host.name":"b"}"#.to_string(),
                json!({"id": 2, "host": {"name": "c"}}).to_string(),
            ]),
        )
        .await?;
    broker
        .produce(
            "plain",
            &values(&[json!({"id": 0}).to_string(), json!({"id": 1}).to_string()]),
        )
        .await?;
    let ws = Workspace::new()?;
    let plain = Pipeline::new("plain", &broker.bootstrap, "plain")
        .sink("local", "hostile", "plain")
        .commit_interval("1s")
        .dead_letter(ws.path("plain-dead-letter.ndjson"));
    let config = ws.write(
        &ws.config()
            .pipeline(pipeline(&ws, "ecs", &broker.bootstrap))
            .pipeline(plain),
    )?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "ecs", 2, Duration::from_secs(60))
        .await?;
    ws.wait_for_rows("hostile", "plain", 2, Duration::from_secs(60))
        .await?;
    agent.terminate()?;
    let letters = dead_lettered(&ws, &[1])?;
    assert!(
        letters[0].reason.contains("host.name"),
        "{}",
        letters[0].reason
    );
    read_ids(&ws, "ecs", &[0, 2])?;
    read_ids(&ws, "plain", &[0, 1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamps_chrono_used_to_accept_are_rejected_at_admission() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("times", 1).await?;
    let bad = [
        "24-01-01T00:00:00Z",        // %Y with 2 digits
        " 2024-01-01T00:00:00Z",     // leading space
        "2024-01-01T23:59:60Z",      // leap second
        "2024-01-01T23:59:6\u{41d}", // a multi-byte character at byte 19
    ];
    // The first value makes `at` a timestamptz column, committed (its type is locked).
    let first = vec![json!({"id": 0, "at": "2024-01-01T00:00:00Z"}).to_string()];
    broker.produce("times", &values(&first)).await?;
    let ws = Workspace::new()?;
    let config = write(&ws, pipeline(&ws, "times", &broker.bootstrap))?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "times", 1, Duration::from_secs(60))
        .await?;
    let mut batch = Vec::new();
    for (i, b) in bad.iter().enumerate() {
        batch.push(json!({"id": i + 1, "at": b}).to_string());
    }
    batch.push(json!({"id": 9, "at": "2024-06-30T12:00:00.5Z"}).to_string());
    broker.produce("times", &values(&batch)).await?;
    ws.wait_for_rows("hostile", "times", 2, Duration::from_secs(60))
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.terminate()?;
    let dump = ws.read("duckdb", "hostile", "times", "id")?;
    let at_type = dump.0["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c[0] == "at")
        .map(|c| c[1].as_str().unwrap().to_string());
    assert_eq!(at_type.as_deref(), Some("timestamptz"));
    dead_lettered(&ws, &[1, 2, 3, 4])?;
    read_ids(&ws, "times", &[0, 9])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_byte_avro_message_with_a_huge_array_count_is_dead_lettered() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("avro", 1).await?;
    let registry = Registry::start(None)?;
    let schema = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"long"},{"name":"xs","type":{"type":"array","items":"long"}}]}"#;
    registry.produce_avro(
        &broker.bootstrap,
        "avro",
        schema,
        &[json!({"id": 0, "xs": [1, 2]})],
    )?;
    // Magic byte, schema id 1, id = 1 (zigzag 2), then an array block of 2^40 items.
    let mut hostile = vec![0u8, 0, 0, 0, 1, 2];
    let mut count: u64 = 1 << 41; // zigzag of 2^40
    while count >= 0x80 {
        hostile.push((count as u8) | 0x80);
        count >>= 7;
    }
    hostile.push(count as u8);
    assert!(hostile.len() <= 12, "{}", hostile.len());
    broker.produce("avro", &[(None, Some(hostile))]).await?;
    registry.produce_avro(
        &broker.bootstrap,
        "avro",
        schema,
        &[json!({"id": 2, "xs": []})],
    )?;
    let ws = Workspace::new()?;
    let config = write(
        &ws,
        pipeline(&ws, "avro", &broker.bootstrap)
            .format("avro")
            .registry(&registry.url),
    )?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "avro", 2, Duration::from_secs(60))
        .await?;
    agent.terminate()?;
    dead_lettered(&ws, &[1])?;
    read_ids(&ws, "avro", &[0, 2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_schema_the_avro_library_panics_on_is_dead_lettered() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("badname", 1).await?;
    let registry = Registry::start(None)?;
    let good = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}"#;
    registry.produce_avro(&broker.bootstrap, "badname", good, &[json!({"id": 0})])?;
    // Schema id 2: a record name apache-avro 0.21 panics on (as in
    // `fuzz/seeds/registry_response/crash-invalid-record-name.json`).
    let bad = r#"{"type":"record","name":"nod-e","fields":[{"name":"id","type":"long"}]}"#;
    let addr = registry.url.trim_start_matches("http://");
    let (status, body) = floe_tests::rest::http(
        "POST",
        addr,
        "/subjects/badname-value/versions",
        &json!({ "schema": bad }).to_string(),
    )?;
    assert_eq!(status, 200, "{body}");
    let id: u32 = serde_json::from_str::<serde_json::Value>(&body)?["id"]
        .as_u64()
        .expect("id") as u32;
    let mut message = vec![0u8];
    message.extend_from_slice(&id.to_be_bytes());
    message.push(2); // id = 1
    broker.produce("badname", &[(None, Some(message))]).await?;
    registry.produce_avro(&broker.bootstrap, "badname", good, &[json!({"id": 2})])?;
    let ws = Workspace::new()?;
    let config = write(
        &ws,
        pipeline(&ws, "badname", &broker.bootstrap)
            .format("avro")
            .registry(&registry.url),
    )?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "badname", 2, Duration::from_secs(60))
        .await?;
    agent.terminate()?;
    let letters = dead_lettered(&ws, &[1])?;
    assert!(
        letters[0].reason.contains("cannot parse"),
        "{}",
        letters[0].reason
    );
    read_ids(&ws, "badname", &[0, 2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_new_name_in_two_committed_structs_commits() -> Result<()> {
    // The same new field `j` added in one batch to two structs that are already
    // committed (as in `fuzz/seeds/json_admission/two-structs-same-new-name.ndjson`).
    let broker = Broker::start()?;
    broker.create_topic("twins", 1).await?;
    broker
        .produce(
            "twins",
            &values(&[
                json!({"id": 0, "b": {"x": 1}}).to_string(),
                json!({"id": 1, "c": {"y": 1}}).to_string(),
            ]),
        )
        .await?;
    let ws = Workspace::new()?;
    let config = write(&ws, pipeline(&ws, "twins", &broker.bootstrap))?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "twins", 2, Duration::from_secs(60))
        .await?;
    broker
        .produce(
            "twins",
            &values(&[
                json!({"id": 2, "c": {"j": 1}}).to_string(),
                json!({"id": 3, "b": {"j": 1}}).to_string(),
            ]),
        )
        .await?;
    let waited = ws
        .wait_for_rows("hostile", "twins", 4, Duration::from_secs(60))
        .await;
    let out = agent.terminate();
    waited?;
    out?;
    read_ids(&ws, "twins", &[0, 1, 2, 3])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_colliding_under_an_empty_parent_name_is_dead_lettered() -> Result<()> {
    // `{"": {"k": 1}}` has the Iceberg full name `.k`, as does a top-level `.k`:
    // admission must refuse the second record, or the batch fails when the schema is
    // built.
    let broker = Broker::start()?;
    broker.create_topic("empty", 1).await?;
    broker
        .produce(
            "empty",
            &values(&[
                r#"{"id":0,"":{"k":2}}"#.to_string(),
                r#"{"id":1,".k":1}"#.to_string(),
                json!({"id": 2}).to_string(),
            ]),
        )
        .await?;
    let ws = Workspace::new()?;
    let config = write(&ws, pipeline(&ws, "empty", &broker.bootstrap))?;
    let agent = AgentProcess::start(&config, &[])?;
    ws.wait_for_rows("hostile", "empty", 2, Duration::from_secs(60))
        .await?;
    agent.terminate()?;
    dead_lettered(&ws, &[1])?;
    // DuckDB renames a column with an empty name (to `C5`) and its reader refuses the
    // table; PyIceberg reads it as it is.
    let dump = ws.read("pyiceberg", "hostile", "empty", "id")?;
    let ids: Vec<i64> = dump
        .rows()
        .iter()
        .map(|r| r["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids, [0, 2]);
    Ok(())
}
