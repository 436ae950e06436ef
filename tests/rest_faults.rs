//! The REST catalog client under faults, against the real catalog (rustberg behind the
//! OAuth2 fixture) with the HTTP fault proxy in between: 429 with `Retry-After`, a
//! token endpoint failing for a moment, a catalog that repeats a page token, and two
//! agents creating the same table at the same moment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use floe_tests::faults::{FaultProxy, FaultyBroker, HttpFault};
use floe_tests::rest::{RestStack, TokenPolicy, WRITER};
use floe_tests::{AgentProcess, TableDump};
use iceberg::Catalog;
use serde_json::json;

/// The stack's catalog as a proxy in front of the token fixture, and its URI.
fn proxied(stack: &RestStack) -> Result<(FaultProxy, String)> {
    let host = stack
        .uri
        .trim_start_matches("http://")
        .split('/')
        .next()
        .context("host")?
        .to_string();
    let proxy = FaultProxy::http(&host)?;
    let uri = stack.uri.replacen(&host, &proxy.address(), 1);
    Ok((proxy, uri))
}

/// Opens the catalog the way the agent does, at `uri`.
async fn open_at(stack: &RestStack, uri: &str) -> Result<Arc<dyn Catalog>> {
    let text = stack.catalog_toml("probe", WRITER).replace(&stack.uri, uri);
    let mut root: toml::Table = toml::from_str(&text)?;
    let section = root
        .remove("catalogs")
        .and_then(|c| c.as_table().and_then(|t| t.get("probe").cloned()))
        .context("catalog section")?;
    let config: floe_iceberg::CatalogConfig = section.try_into()?;
    Ok(floe_iceberg::open_catalog("probe", &config).await?.catalog)
}

fn records(range: std::ops::Range<i64>, source: &str) -> Vec<floe_tests::Message> {
    range
        .map(|i| {
            (
                None,
                Some(json!({"id": i, "source": source}).to_string().into_bytes()),
            )
        })
        .collect()
}

/// An agent config: pipeline `name` reading `topic` into `faults.table` through `uri`.
fn config(
    stack: &RestStack,
    dir: &std::path::Path,
    uri: &str,
    bootstrap: &str,
    (name, topic, table): (&str, &str, &str),
) -> Result<std::path::PathBuf> {
    let text = format!(
        "{}\n{}",
        stack.catalog_toml("lake", WRITER).replace(&stack.uri, uri),
        floe_tests::rest::pipeline_toml(name, bootstrap, topic, "lake", ("faults", table), dir)
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

async fn wait_rows(stack: &RestStack, table: &str, n: i64, agents: &[&AgentProcess]) -> Result<()> {
    let catalog = stack.open_catalog(WRITER).await?;
    let start = Instant::now();
    loop {
        let rows = floe_tests::committed_rows(catalog.as_ref(), "faults", table)
            .await
            .unwrap_or(0);
        if rows >= n {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            let out: Vec<String> = agents.iter().map(|a| a.output()).collect();
            bail!("{rows} of {n} rows in {table}:\n{}", out.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn ids(dump: &TableDump) -> Vec<i64> {
    let mut ids: Vec<i64> = dump
        .rows()
        .iter()
        .map(|r| r["id"].as_i64().expect("id"))
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_waited_out_for_as_long_as_retry_after_says() -> Result<()> {
    let stack = RestStack::start(TokenPolicy::default())?;
    let (proxy, uri) = proxied(&stack)?;
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("slow", 1).await?;
    let dir = tempfile::tempdir()?;
    let path = config(
        &stack,
        dir.path(),
        &uri,
        &broker.bootstrap(),
        ("slow", "slow", "slow"),
    )?;
    broker.produce("slow", &records(0..50, "a")).await?;
    let agent = AgentProcess::start(&path, &[])?;
    wait_rows(&stack, "slow", 50, &[&agent]).await?;
    // The next two commits are answered 429 (not processed), Retry-After 2 s.
    proxy.inject(
        HttpFault::status("/tables/slow", 429)
            .method("POST")
            .header("Retry-After", "2")
            .times(2),
    );
    broker.produce("slow", &records(50..100, "a")).await?;
    wait_rows(&stack, "slow", 100, &[&agent]).await?;
    let out = agent.terminate()?;
    assert_eq!(proxy.injected(), 2, "{:?}", proxy.requests());
    // Each 429 is followed by a wait of (about) two seconds before the commit is sent again.
    let commits = proxy.timed_requests("POST /api/catalog/v1/namespaces/faults/tables/slow");
    let waits: Vec<Duration> = commits
        .windows(2)
        .filter(|w| w[0].1.contains("injected 429"))
        .map(|w| w[1].0 - w[0].0)
        .collect();
    assert_eq!(waits.len(), 2, "{commits:?}");
    assert!(
        waits.iter().all(|w| *w >= Duration::from_millis(1900)),
        "waits after a 429: {waits:?}"
    );
    assert!(out.contains("429"), "{out}");
    let dump = stack.read("duckdb", "faults", "slow", "id")?;
    assert_eq!(ids(&dump), (0..100).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_requests_failing_for_a_moment_are_retried() -> Result<()> {
    let stack = RestStack::start(TokenPolicy::default())?;
    let (proxy, uri) = proxied(&stack)?;
    proxy.inject(HttpFault::status("/v1/oauth/tokens", 503).times(2));
    let catalog = open_at(&stack, &uri).await?;
    catalog.list_namespaces(None).await?;
    assert_eq!(proxy.injected(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_page_token_ends_the_listing_instead_of_looping() -> Result<()> {
    let stack = RestStack::start(TokenPolicy::default())?;
    let (proxy, uri) = proxied(&stack)?;
    let catalog = open_at(&stack, &uri).await?;
    proxy.inject(
        HttpFault::status("/namespaces", 200)
            .method("GET")
            .body(r#"{"namespaces":[["a"]],"next-page-token":"same"}"#),
    );
    let listed = tokio::time::timeout(Duration::from_secs(30), catalog.list_namespaces(None))
        .await
        .context("the listing loops")?;
    let e = listed.expect_err("a repeated token is an error");
    assert!(e.to_string().contains("again"), "{e}");
    assert_eq!(proxy.injected(), 2, "first page, then the repeat");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_creating_the_same_table_at_the_same_moment_both_commit() -> Result<()> {
    let stack = RestStack::start(TokenPolicy::default())?;
    let (proxy, uri) = proxied(&stack)?;
    let broker = FaultyBroker::start(None)?;
    broker.create_topic("left", 1).await?;
    broker.create_topic("right", 1).await?;
    broker.produce("left", &records(0..100, "left")).await?;
    broker.produce("right", &records(100..200, "right")).await?;
    // Both creations (namespace, then table) wait for each other at the proxy.
    proxy.inject(
        HttpFault::hold("/namespaces")
            .method("POST")
            .ending("/namespaces")
            .times(2),
    );
    let dir = tempfile::tempdir()?;
    let a = config(
        &stack,
        dir.path(),
        &uri,
        &broker.bootstrap(),
        ("left", "left", "shared"),
    )?;
    let b = config(
        &stack,
        dir.path(),
        &uri,
        &broker.bootstrap(),
        ("right", "right", "shared"),
    )?;
    let left = AgentProcess::start(&a, &[])?;
    let right = AgentProcess::start(&b, &[])?;
    let wait_held = |n: u64| {
        let proxy = &proxy;
        async move {
            let start = Instant::now();
            while proxy.held() < n {
                if start.elapsed() > Duration::from_secs(90) {
                    bail!(
                        "{} of {n} creations held: {:?}",
                        proxy.held(),
                        proxy.requests()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        }
    };
    wait_held(2).await?;
    proxy.inject(
        HttpFault::hold("/namespaces/faults/tables")
            .method("POST")
            .ending("/tables")
            .times(2),
    );
    proxy.release();
    wait_held(4).await?;
    proxy.release();
    wait_rows(&stack, "shared", 200, &[&left, &right]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out_left = left.terminate()?;
    let out_right = right.terminate()?;
    let both = format!("{out_left}\n{out_right}");
    assert!(
        both.contains("created by another writer"),
        "one of them found the table created by the other:\n{both}"
    );
    for reader in ["pyiceberg", "duckdb"] {
        let dump = stack.read(reader, "faults", "shared", "id")?;
        assert_eq!(ids(&dump), (0..200).collect::<Vec<_>>(), "{reader}");
    }
    Ok(())
}
