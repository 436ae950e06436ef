//! Floe against a real Iceberg REST catalog (rustberg) on real S3 (moto), behind an
//! OAuth2 client-credentials token endpoint (`tests/fixtures/oauth_token_proxy.py`):
//! vended credentials, token renewal, clear errors, `floe check`.

use std::time::{Duration, Instant};

use anyhow::Result;
use floe_tests::rest::{READER, RestStack, TokenPolicy, WRITER, pipeline_toml, wait_for_rows};
use floe_tests::{
    AgentProcess, Broker, Message, PipelineSpec, Workspace, floe_cmd, free_port, spawn_agent,
};

fn messages(from: i64, to: i64) -> Vec<Message> {
    (from..to)
        .map(|i| {
            let value = format!(r#"{{"id": {i}, "name": "user-{i}", "score": {}.5}}"#, i % 7);
            (Some(format!("k{i}").into_bytes()), Some(value.into_bytes()))
        })
        .collect()
}

fn write_config(dir: &std::path::Path, text: &str) -> Result<std::path::PathBuf> {
    let path = dir.join("floe.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Kafka -> Floe (REST catalog, S3 with vended credentials) -> PyIceberg and DuckDB, which
/// read the same rows through the same catalog; then `floe check` passes on that config
/// and fails, with reasons, on a missing topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_end_to_end_with_vended_credentials() -> Result<()> {
    let started = Instant::now();
    let broker = Broker::start()?;
    let stack = RestStack::start(TokenPolicy::default())?;
    broker.create_topic("events", 2).await?;
    broker.produce("events", &messages(0, 40)).await?;

    let dir = tempfile::tempdir()?;
    let text = stack.catalog_toml("lake", WRITER)
        + &pipeline_toml(
            "events",
            &broker.bootstrap,
            "events",
            "lake",
            ("analytics", "events"),
            dir.path(),
        );
    let config = write_config(dir.path(), &text)?;
    // No S3 keys anywhere: the agent can only write with what the catalog vends.
    let env = [
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/nonexistent"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
    ];
    let agent = AgentProcess::start(&config, &env)?;
    let catalog = stack.open_catalog(WRITER).await?;
    wait_for_rows(
        catalog.as_ref(),
        "analytics",
        "events",
        40,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.context(agent.output()))?;
    broker.produce("events", &messages(40, 60)).await?;
    wait_for_rows(
        catalog.as_ref(),
        "analytics",
        "events",
        60,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.context(agent.output()))?;
    let log = agent.terminate()?;
    assert!(!log.contains("vended no storage credentials"), "{log}");

    let py = stack.read("pyiceberg", "analytics", "events", "id")?;
    let duck = stack.read("duckdb", "analytics", "events", "id")?;
    assert_eq!(py.rows().len(), 60);
    assert_eq!(py.rows(), duck.rows(), "PyIceberg and DuckDB disagree");
    for (i, row) in py.rows().iter().enumerate() {
        assert_eq!(row["id"], i as i64);
        assert_eq!(row["name"], format!("user-{i}"));
    }
    assert!(py.columns().contains(&"_kafka_offset".to_string()));

    let (code, stdout, stderr) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    assert_eq!(code, 0, "{stdout}{stderr}");
    for step in [
        "token",
        "catalog",
        "namespaces",
        "table",
        "storage",
        "broker",
        "topics",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(step))
            .unwrap_or_else(|| panic!("no {step} line in:\n{stdout}"));
        assert!(line.contains(" ok "), "{line}\n{stdout}");
    }
    assert!(
        stdout.contains("wrote and deleted s3://warehouse/"),
        "{stdout}"
    );
    eprintln!("floe check:\n{stdout}");

    // Without access delegation the agent writes with its own keys and endpoint.
    let own_keys = text.replace(
        "s3.region = \"us-east-1\"",
        "s3.region = \"us-east-1\"\naccess_delegation = \"none\"\ns3.access-key-id = \"testing\"\ns3.secret-access-key = \"testing\"",
    );
    std::fs::write(&config, &own_keys)?;
    let (code, stdout, _) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("wrote and deleted s3://warehouse/"),
        "{stdout}"
    );

    std::fs::write(
        &config,
        text.replace("topics = [\"events\"]", "topics = [\"events\", \"absent\"]"),
    )?;
    let (code, stdout, _) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("FAIL") && stdout.contains("missing: absent"),
        "{stdout}"
    );
    eprintln!("end-to-end test took {:?}", started.elapsed());
    Ok(())
}

/// Tokens living 3 s and vended credentials stamped to expire: the pipeline keeps
/// committing across token renewals, each token replaced before it expires (the
/// fixture never sees an expired one), and the storage credentials are fetched again
/// from the catalog's `/credentials` endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_tokens_and_credentials_are_renewed() -> Result<()> {
    let started = Instant::now();
    let broker = Broker::start()?;
    // Credentials valid for 125 s count as stale 120 s ahead of expiry: renewed after ~5 s.
    let stack = RestStack::start(TokenPolicy {
        ttl_secs: 3,
        vended_ttl_ms: 125_000,
    })?;
    broker.create_topic("clicks", 1).await?;
    let dir = tempfile::tempdir()?;
    let text = stack.catalog_toml("lake", WRITER)
        + &pipeline_toml(
            "clicks",
            &broker.bootstrap,
            "clicks",
            "lake",
            ("web", "clicks"),
            dir.path(),
        );
    let config = write_config(dir.path(), &text)?;
    let agent = AgentProcess::start(&config, &[])?;
    let catalog = stack.open_catalog(WRITER).await?;
    let mut sent = 0;
    for round in 0..4 {
        broker.produce("clicks", &messages(sent, sent + 10)).await?;
        sent += 10;
        wait_for_rows(
            catalog.as_ref(),
            "web",
            "clicks",
            sent,
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| e.context(agent.output()))?;
        // Longer than a token's life, and (after the second round) than the credentials' freshness.
        tokio::time::sleep(Duration::from_secs(if round == 1 { 6 } else { 3 })).await;
    }
    let log = agent.terminate()?;
    let stats = stack.token_stats()?;
    let issued = stats["tokens_issued"].as_i64().unwrap_or(0);
    // The probe catalog of this test fetched one token too.
    assert!(issued >= 4, "only {issued} tokens issued: {stats}\n{log}");
    assert_eq!(
        stats["rejected"], 0,
        "a token was used after it expired: {stats}\n{log}"
    );
    assert!(
        stats["credential_requests"].as_i64().unwrap_or(0) >= 1
            && log.contains("renewed vended storage credentials"),
        "{stats}\n{log}"
    );
    let py = stack.read("pyiceberg", "web", "clicks", "id")?;
    assert_eq!(py.rows().len() as i64, sent);
    eprintln!(
        "token renewal test took {:?} ({issued} tokens issued)",
        started.elapsed()
    );
    Ok(())
}

/// A wrong secret (401), a principal without the create privilege (403) and a URI
/// without the catalog's base path (404) each stop the agent with a message that says
/// what to fix; `floe check` reports the same. A token the catalog revokes costs one 401
/// and a new token, and the pipeline goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_privilege_and_path_errors_are_clear() -> Result<()> {
    let started = Instant::now();
    let broker = Broker::start()?;
    let stack = RestStack::start(TokenPolicy::default())?;
    broker.create_topic("orders", 1).await?;
    broker.produce("orders", &messages(0, 3)).await?;
    let dir = tempfile::tempdir()?;
    let pipeline = pipeline_toml(
        "orders",
        &broker.bootstrap,
        "orders",
        "lake",
        ("sales", "orders"),
        dir.path(),
    );

    // 401: wrong client secret.
    let text = stack.catalog_toml("lake", (WRITER.0, "not-the-secret")) + &pipeline;
    let config = write_config(dir.path(), &text)?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(30))?;
    assert!(!status.success());
    assert!(
        out.contains("OAuth2 token request")
            && out.contains("HTTP 401")
            && out.contains("wrong or expired"),
        "{out}"
    );
    assert!(
        !out.contains("not-the-secret"),
        "the secret leaked into the log:\n{out}"
    );
    let (code, stdout, _) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("token") && l.contains("FAIL") && l.contains("wrong or expired")),
        "{stdout}"
    );

    // 403: the reader principal may read and list, not create a namespace.
    let text = stack.catalog_toml("lake", READER) + &pipeline;
    let config = write_config(dir.path(), &text)?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success());
    assert!(
        out.contains("create namespace sales")
            && out.contains("HTTP 403")
            && out.contains("lacks the privilege"),
        "{out}"
    );

    // 404: the URI misses the catalog's base path (`/api/catalog` for Polaris).
    let text = stack
        .catalog_toml("lake", WRITER)
        .replace("/api/catalog", "")
        + &pipeline;
    let config = write_config(dir.path(), &text)?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(30))?;
    assert!(!status.success());
    assert!(
        out.contains("HTTP 404") && out.contains("/api/catalog"),
        "{out}"
    );
    // A token the catalog stops accepting (revoked; tokens here live an hour, so the agent
    // does not renew it by itself): one 401, a new token, the same request again.
    let text = stack.catalog_toml("lake", WRITER) + &pipeline;
    let config = write_config(dir.path(), &text)?;
    let agent = AgentProcess::start(&config, &[])?;
    let catalog = stack.open_catalog(WRITER).await?;
    wait_for_rows(
        catalog.as_ref(),
        "sales",
        "orders",
        3,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.context(agent.output()))?;
    stack.revoke_tokens()?;
    broker.produce("orders", &messages(3, 6)).await?;
    let catalog = stack.open_catalog(WRITER).await?;
    wait_for_rows(
        catalog.as_ref(),
        "sales",
        "orders",
        6,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.context(agent.output()))?;
    let log = agent.terminate()?;
    let stats = stack.token_stats()?;
    assert!(stats["rejected"].as_i64().unwrap_or(0) >= 1, "{stats}");
    assert!(log.contains("token rejected (401)"), "{log}");

    eprintln!("error test took {:?}", started.elapsed());
    Ok(())
}

/// `floe check` on the embedded catalog: before the first run the missing table is fine
/// (create_table = true) and storage is probed at the top of the warehouse; after it
/// every step passes, storage under the table included; a broker that is not there
/// fails with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_works_for_the_embedded_catalog() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("logs", 1).await?;
    let ws = Workspace::new()?;
    let spec = PipelineSpec {
        name: "logs",
        bootstrap: &broker.bootstrap,
        topic: "logs",
        namespace: "ops",
        table: "logs",
        commit_interval: "1s",
    };
    let config = ws.write_config(&spec)?;
    let run_check = || floe_cmd(&["check", "--config", config.to_str().unwrap()]);
    let (code, stdout, stderr) = run_check()?;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("created on the first commit"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("storage") && l.contains(" ok ") && l.contains("/.floe-check-")),
        "{stdout}"
    );

    broker.produce("logs", &messages(0, 5)).await?;
    let agent = spawn_agent(&config)?;
    ws.wait_for_rows("ops", "logs", 5, Duration::from_secs(60))
        .await?;
    agent.stop().await?;
    let (code, stdout, _) = run_check()?;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("wrote and deleted file://"), "{stdout}");
    assert!(
        stdout.contains("check: 6 ok, 0 failed, 1 skipped"),
        "{stdout}"
    );

    let dead = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)?.replace(&broker.bootstrap, &dead),
    )?;
    let (code, stdout, _) = run_check()?;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("broker") && l.contains("FAIL")),
        "{stdout}"
    );
    Ok(())
}
