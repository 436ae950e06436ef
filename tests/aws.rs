//! The agent's own AWS identity (aws-config's default chain): SigV4-signed REST catalog
//! requests, checked by a proxy that recomputes every signature with botocore (as AWS
//! Glue's and S3 Tables' endpoints do), and S3 written with credentials from a web
//! identity token followed by an assume-role with an external id, or from a profile of
//! the shared config files that assumes a role (moto's STS).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use floe_tests::reference::assert_append_table;
use floe_tests::rest::{RestStack, TokenPolicy, WAREHOUSE, WRITER, pipeline_toml};
use floe_tests::{AgentProcess, Broker, Message, wait_for_messages};
use serde_json::{Value, json};

const KEY: (&str, &str) = ("AKIDFLOESIGNER", "floe-signing-secret");
const ROWS: usize = 400;

fn records(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let v = json!({"id": i, "sku": format!("s{}", i % 13), "price": i as f64 / 8.0});
            (
                Some(format!("k{i}").into_bytes()),
                Some(v.to_string().into_bytes()),
            )
        })
        .collect()
}

/// Environment of an agent whose AWS identity is only what a test gives it.
fn aws_env(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
        ("AWS_CONFIG_FILE", "/nonexistent/floe-test".to_string()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/floe-test".to_string(),
        ),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    env.extend(extra.iter().cloned());
    env
}

fn start(config: &Path, env: &[(&'static str, String)]) -> Result<AgentProcess> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    AgentProcess::start(config, &env)
}

async fn wait_covered(stack: &RestStack, agent: &AgentProcess, n: i64) -> Result<()> {
    let catalog = stack.open_catalog(WRITER).await?;
    if let Err(e) = wait_for_messages(
        catalog.as_ref(),
        "shop",
        "orders",
        "orders",
        n,
        Duration::from_secs(120),
    )
    .await
    {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    Ok(())
}

/// `sigv4 = true`: every catalog request is signed for `glue` with the credentials of
/// the default chain (here the environment); the proxy verifies each one. The rows are
/// exact, `floe check` names the signing identity, and a wrong secret is refused with
/// AWS's own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_catalog_requests_pass_a_verifying_proxy() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("orders", 2).await?;
    broker.produce("orders", &records(ROWS)).await?;
    let stack = RestStack::start(TokenPolicy::default())?;
    let proxy = stack.sigv4_proxy("glue", KEY)?;
    let ws = floe_tests::Workspace::new()?;
    let catalog = format!(
        r#"
[catalogs.glue]
type = "rest"
uri = "{uri}"
warehouse = "{WAREHOUSE}"
sigv4 = true
signing_name = "glue"
signing_region = "us-east-1"
s3.endpoint = "{s3}"
s3.region = "us-east-1"
s3.path-style-access = true
"#,
        uri = proxy.uri,
        s3 = stack.s3_endpoint,
    );
    let config = ws.path("floe.toml");
    std::fs::write(
        &config,
        catalog
            + &pipeline_toml(
                "orders",
                &broker.bootstrap,
                "orders",
                "glue",
                ("shop", "orders"),
                ws.dir.path(),
            ),
    )?;
    let keys = |secret: &str| {
        aws_env(&[
            ("AWS_ACCESS_KEY_ID", KEY.0.to_string()),
            ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
        ])
    };
    let agent = start(&config, &keys(KEY.1))?;
    wait_covered(&stack, &agent, ROWS as i64).await?;
    agent.terminate()?;
    let stats = proxy.stats()?;
    assert_eq!(stats["rejected"], json!(0), "{stats}");
    assert!(
        stats["by_access_key"][KEY.0].as_u64().unwrap_or(0) >= 5,
        "{stats}"
    );
    assert_append_table(&broker.bootstrap, "orders", ROWS, "signed catalog", |r| {
        stack.read(r, "shop", "orders", "id")
    })?;

    let check = |secret: &str| -> Result<String> {
        let env = keys(secret);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let args = ["check", "--config", config.to_str().expect("utf-8")];
        let (_, out) = AgentProcess::command(&args, &env)?.wait_exit(Duration::from_secs(60))?;
        Ok(out)
    };
    let out = check(KEY.1)?;
    assert!(
        out.contains("SigV4 for glue in us-east-1, AWS credentials found"),
        "{out}"
    );
    assert!(
        !out.contains(KEY.0),
        "`floe check` printed the access key id:\n{out}"
    );
    let out = check("not-the-secret")?;
    assert!(
        out.contains("403") && out.contains("SigV4 signature"),
        "{out}"
    );
    let stats = proxy.stats()?;
    assert!(stats["rejected"].as_u64().unwrap_or(0) >= 1, "{stats}");
    Ok(())
}

/// The `orders` pipeline on `stack`'s catalog `lake` plus `catalog_extra` lines, with
/// `ROWS` records waiting in the topic; returns the config file in `ws`.
async fn orders_on_s3(
    ws: &floe_tests::Workspace,
    stack: &RestStack,
    broker: &Broker,
    catalog_extra: &str,
) -> Result<PathBuf> {
    broker.create_topic("orders", 2).await?;
    broker.produce("orders", &records(ROWS)).await?;
    let config = ws.path("floe.toml");
    std::fs::write(
        &config,
        stack.catalog_toml("lake", WRITER)
            + catalog_extra
            + &pipeline_toml(
                "orders",
                &broker.bootstrap,
                "orders",
                "lake",
                ("shop", "orders"),
                ws.dir.path(),
            ),
    )?;
    Ok(config)
}

/// Runs the agent with `env` until the table covers every record, then compares every
/// value through both readers.
async fn ingest_exactly(
    stack: &RestStack,
    broker: &Broker,
    config: &Path,
    env: &[(&'static str, String)],
    what: &str,
) -> Result<()> {
    let agent = start(config, env)?;
    wait_covered(stack, &agent, ROWS as i64).await?;
    agent.terminate()?;
    assert_append_table(&broker.bootstrap, "orders", ROWS, what, |r| {
        stack.read(r, "shop", "orders", "id")
    })
}

/// The role sessions moto's STS has handed out.
fn assumed_roles(stack: &RestStack) -> Result<Vec<Value>> {
    let addr = stack.s3_endpoint.trim_start_matches("http://");
    let (_, body) = floe_tests::rest::http("GET", addr, "/moto-api/data.json", "")?;
    let data: Value = serde_json::from_str(&body)?;
    Ok(data["sts"]["AssumedRole"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// `access_delegation = "none"` without S3 keys: the agent writes S3 with the SDK chain's
/// identity: a web identity token (as on EKS with IRSA) exchanged at STS, then
/// `aws.role_arn` assumed with `aws.external_id` (cross-account). moto's STS records
/// both calls; the rows land exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_credentials_come_from_web_identity_then_an_assumed_role() -> Result<()> {
    let broker = Broker::start()?;
    let stack = RestStack::start(TokenPolicy::default())?;
    let ws = floe_tests::Workspace::new()?;
    let token = ws.path("web-identity-token");
    std::fs::write(&token, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJmbG9lIn0.sig")?;
    let lake_role = "arn:aws:iam::333333333333:role/floe-lake-writer";
    let config = orders_on_s3(
        &ws,
        &stack,
        &broker,
        &format!(
            "access_delegation = \"none\"\naws.role_arn = \"{lake_role}\"\naws.external_id = \"floe-external-id\"\naws.role_session_name = \"floe-test\"\n"
        ),
    )
    .await?;
    let env = aws_env(&[
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token.display().to_string()),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::222222222222:role/floe-pod".to_string(),
        ),
        ("AWS_ROLE_SESSION_NAME", "floe-pod-session".to_string()),
        ("AWS_ENDPOINT_URL_STS", stack.s3_endpoint.clone()),
    ]);
    ingest_exactly(&stack, &broker, &config, &env, "S3 as an assumed role").await?;

    let assumed = assumed_roles(&stack)?;
    let role = |arn: &str| assumed.iter().find(|r| r["role_arn"] == json!(arn));
    let pod = role("arn:aws:iam::222222222222:role/floe-pod");
    assert!(
        pod.is_some_and(|r| r["session_name"] == json!("floe-pod-session")),
        "no web-identity session in {assumed:?}"
    );
    let lake = role(lake_role);
    assert!(
        lake.is_some_and(|r| r["external_id"] == json!("floe-external-id")
            && r["session_name"] == json!("floe-test")),
        "no assumed lake role with the external id in {assumed:?}"
    );
    Ok(())
}

/// `aws.profile` names a profile of the shared config files that assumes a role from a
/// source profile's keys (`role_arn`, `source_profile`, `external_id`): the agent writes
/// S3 as that role, which moto's STS records; the rows land exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_credentials_come_from_a_profile_that_assumes_a_role() -> Result<()> {
    let broker = Broker::start()?;
    let stack = RestStack::start(TokenPolicy::default())?;
    let ws = floe_tests::Workspace::new()?;
    let profile_role = "arn:aws:iam::444444444444:role/floe-profile-role";
    let aws_config = ws.path("aws-config");
    std::fs::write(
        &aws_config,
        format!(
            "[profile lake]\nrole_arn = {profile_role}\nsource_profile = base\nrole_session_name = floe-profile-session\nexternal_id = floe-profile-external\n\n[profile base]\nregion = us-east-1\n"
        ),
    )?;
    let credentials = ws.path("aws-credentials");
    std::fs::write(
        &credentials,
        "[base]\naws_access_key_id = AKIAFLOEBASEPROFILE\naws_secret_access_key = floe-base-secret\n",
    )?;
    let config = orders_on_s3(
        &ws,
        &stack,
        &broker,
        "access_delegation = \"none\"\naws.profile = \"lake\"\n",
    )
    .await?;
    let env = aws_env(&[
        ("AWS_CONFIG_FILE", aws_config.display().to_string()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            credentials.display().to_string(),
        ),
        ("AWS_ENDPOINT_URL_STS", stack.s3_endpoint.clone()),
    ]);
    ingest_exactly(&stack, &broker, &config, &env, "S3 as a profile's role").await?;
    let assumed = assumed_roles(&stack)?;
    assert!(
        assumed.iter().any(|r| r["role_arn"] == json!(profile_role)
            && r["session_name"] == json!("floe-profile-session")
            && r["external_id"] == json!("floe-profile-external")),
        "no session of the profile's role in {assumed:?}"
    );
    Ok(())
}
