//! The SQL catalog on Postgres (`type = "sql"`): agents in separate processes, each in
//! its own working directory as on separate machines, share one table through a
//! catalog in a real Postgres server; each is SIGKILLed once while committing. Three
//! independent readers (PyIceberg's `SqlCatalog` and Spark's `JdbcCatalog` on Postgres,
//! DuckDB on the metadata it names) must see exactly the topic's records, every column
//! of every row.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use floe_tests::faults::FaultProxy;
use floe_tests::postgres::Postgres;
use floe_tests::reference::{append_rows, assert_append_table, assert_rows, read_topic};
use floe_tests::{
    AgentProcess, Broker, CatalogSection, Config, Message, Pipeline, wait_for_messages,
};
use serde_json::json;

const TOPIC: &str = "orders";
const RECORDS: i64 = 3_000;

fn records(from: i64, to: i64) -> Vec<Message> {
    (from..to)
        .map(|i| {
            let value = json!({
                "id": i,
                "customer": format!("c{}", i % 37),
                "amount": (i as f64) * 1.25,
                "paid": i % 3 == 0,
                "lines": [format!("sku{}", i % 11), format!("sku{}", i % 5)],
            });
            (
                Some(format!("k{i}").into_bytes()),
                Some(value.to_string().into_bytes()),
            )
        })
        .collect()
}

/// A machine's config in `dir`: the shared catalog `lake`, its own dead-letter file.
fn config(dir: &Path, catalog: CatalogSection, bootstrap: &str) -> Result<PathBuf> {
    let pipeline = Pipeline::new("orders", bootstrap, TOPIC)
        .property("session.timeout.ms", "6000")
        .property("heartbeat.interval.ms", "500")
        .dead_letter(dir.join("dead-letter.ndjson"))
        .sink("lake", "shop", "orders")
        .commit_interval("1s");
    Config::new()
        .catalog("lake", catalog)
        .pipeline(pipeline)
        .write(dir.join("floe.toml"))
}

/// `shop.orders` of catalog `lake`, read by `reader`, in offset order.
fn read_orders(pg: &Postgres, warehouse: &Path, reader: &str) -> Result<floe_tests::TableDump> {
    pg.read(
        reader,
        "lake",
        warehouse,
        "shop.orders",
        "_kafka_partition,_kafka_offset",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_two_machines_share_a_postgres_catalog_through_kills() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    broker.create_topic(TOPIC, 4).await?;
    let lake = tempfile::tempdir()?;
    let warehouse = lake.path().join("warehouse");
    let machine_a = tempfile::tempdir()?;
    let machine_b = tempfile::tempdir()?;
    let a_config = config(machine_a.path(), pg.catalog(&warehouse), &broker.bootstrap)?;
    let b_config = config(machine_b.path(), pg.catalog(&warehouse), &broker.bootstrap)?;

    broker.produce(TOPIC, &records(0, 1_000)).await?;
    // Both start at once on an empty database: they race to create the catalog's tables
    // and the table itself.
    let a = AgentProcess::start(&a_config, &[])?;
    let b = AgentProcess::start(&b_config, &[])?;
    let config = pg.catalog_config(&warehouse);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let catalog = floe_iceberg::open_catalog("lake", &config).await?.catalog;
    let covered = |n: i64| {
        let catalog = catalog.clone();
        async move {
            wait_for_messages(
                catalog.as_ref(),
                "shop",
                "orders",
                "orders",
                n,
                Duration::from_secs(150),
            )
            .await
        }
    };
    if let Err(e) = covered(300).await {
        bail!(
            "{e}\n--- agent A:\n{}\n--- agent B:\n{}",
            a.output(),
            b.output()
        );
    }
    a.kill9()?;
    broker.produce(TOPIC, &records(1_000, 2_000)).await?;
    let a = AgentProcess::start(&a_config, &[])?;
    if let Err(e) = covered(1_500).await {
        bail!(
            "{e}\n--- agent A:\n{}\n--- agent B:\n{}",
            a.output(),
            b.output()
        );
    }
    b.kill9()?;
    broker.produce(TOPIC, &records(2_000, RECORDS)).await?;
    let b = AgentProcess::start(&b_config, &[])?;
    if let Err(e) = covered(RECORDS).await {
        bail!(
            "{e}\n--- agent A:\n{}\n--- agent B:\n{}",
            a.output(),
            b.output()
        );
    }
    a.terminate()?;
    b.terminate()?;

    let read = |reader: &str| read_orders(&pg, &warehouse, reader);
    assert_append_table(
        &broker.bootstrap,
        TOPIC,
        RECORDS as usize,
        "a table shared through Postgres",
        read,
    )?;
    let expected = append_rows(&read_topic(
        &broker.bootstrap,
        TOPIC,
        RECORDS as usize,
        Duration::from_secs(60),
    )?);
    assert_rows(
        "spark",
        &read("spark")?,
        &expected,
        &["_kafka_partition", "_kafka_offset"],
        &[],
    )?;
    for dir in [machine_a.path(), machine_b.path()] {
        let letters =
            floe::dead_letter::DeadLetterWriter::read_all(&dir.join("dead-letter.ndjson"))
                .unwrap_or_default();
        assert!(letters.is_empty(), "{letters:?}");
    }
    Ok(())
}

/// A SQL catalog on Postgres with its warehouse on S3 (moto), as agents on several
/// machines run it without a shared file system: no S3 keys in the config, the agent's
/// identity comes from the AWS chain (environment keys here). PyIceberg and DuckDB read
/// every value of every row through the catalog and S3.
/// A catalog database that is down when the agent boots (behind a proxy that refuses
/// connections) is waited for; once it answers, the agent ingests every record exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_down_at_boot_is_waited_for() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    broker.create_topic(TOPIC, 2).await?;
    broker.produce(TOPIC, &records(0, 200)).await?;
    let address = pg
        .uri
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(host, _)| host.to_string())
        .context("host:port in the uri")?;
    let proxy = FaultProxy::tcp(&address)?;
    proxy.refuse();
    let uri = pg.uri.replace(&address, &proxy.address());
    let lake = tempfile::tempdir()?;
    let warehouse = lake.path().join("warehouse");
    let machine = tempfile::tempdir()?;
    let config = config(
        machine.path(),
        CatalogSection::sql(&uri, &warehouse),
        &broker.bootstrap,
    )?;
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("waiting for the catalog", Duration::from_secs(60))?;
    std::thread::sleep(Duration::from_secs(5));
    proxy.restore()?;
    let catalog = pg.catalog_config(&warehouse);
    let opened = floe_iceberg::open_catalog("lake", &catalog).await?.catalog;
    floe_tests::wait_for_rows(
        opened.as_ref(),
        "shop",
        "orders",
        200,
        Duration::from_secs(120),
    )
    .await
    .with_context(|| agent.output())?;
    agent.terminate()?;
    assert_append_table(&broker.bootstrap, TOPIC, 200, "after the wait", |reader| {
        read_orders(&pg, &warehouse, reader)
    })
}

/// A catalog database Spark's `JdbcCatalog` created with its default (V0) layout: Floe
/// says which statement upgrades it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_in_the_jdbc_v0_layout_is_refused_with_the_upgrade() -> Result<()> {
    let pg = Postgres::start()?;
    pg.execute(
        "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL, \
         table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, \
         metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000), \
         PRIMARY KEY (catalog_name, table_namespace, table_name))",
    )?;
    let lake = tempfile::tempdir()?;
    let config = pg.catalog_config(lake.path());
    let error = match floe_iceberg::open_catalog("lake", &config).await {
        Ok(_) => bail!("a V0 catalog opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("ALTER TABLE iceberg_tables ADD COLUMN iceberg_type VARCHAR(5)"),
        "{error}"
    );
    pg.execute("ALTER TABLE iceberg_tables ADD COLUMN iceberg_type VARCHAR(5)")?;
    floe_iceberg::open_catalog("lake", &config).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_catalog_keeps_its_tables_on_s3() -> Result<()> {
    let pg = Postgres::start()?;
    let moto = floe_tests::faults::Moto::start()?;
    let broker = Broker::start()?;
    broker.create_topic(TOPIC, 2).await?;
    broker.produce(TOPIC, &records(0, 600)).await?;
    let warehouse = format!("s3://{}/lake", floe_tests::faults::Moto::BUCKET);
    let machine = tempfile::tempdir()?;
    let catalog = pg.catalog(&warehouse).s3_store(&moto.endpoint, "us-east-1");
    let path = config(machine.path(), catalog, &broker.bootstrap)?;
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let agent = AgentProcess::start(&path, &env)?;
    let config = floe_iceberg::CatalogConfig::Sql {
        uri: floe::config::Redacted(pg.uri.clone()),
        warehouse: warehouse.clone(),
        s3: toml::from_str(&format!(
            "endpoint = \"{}\"\npath-style-access = true\nregion = \"us-east-1\"\naccess-key-id = \"testing\"\nsecret-access-key = \"testing\"\n",
            moto.endpoint
        ))?,
        aws: Default::default(),
    };
    let catalog = floe_iceberg::open_catalog("lake", &config).await?.catalog;
    if let Err(e) = wait_for_messages(
        catalog.as_ref(),
        "shop",
        "orders",
        "orders",
        600,
        Duration::from_secs(120),
    )
    .await
    {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    agent.terminate()?;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["shop", "orders"])?)
        .await?;
    anyhow::ensure!(
        table.metadata().location().starts_with(&warehouse),
        "table at {}",
        table.metadata().location()
    );
    assert_append_table(&broker.bootstrap, TOPIC, 600, "a table on S3", |reader| {
        pg.read_at(
            reader,
            "lake",
            (&warehouse, Some(&moto.endpoint)),
            "shop.orders",
            "_kafka_partition,_kafka_offset",
        )
    })?;
    Ok(())
}
