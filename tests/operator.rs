//! What operators see and deploy: `floe top`, `/healthz` and `/readyz`, the progress
//! lines and log formats, against a real broker and `floe` processes; and the Grafana
//! dashboard, the alert rules and the container and Kubernetes files, checked against
//! what the agent exports and serves.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use floe::telemetry::metric::{METRICS, MetricKind};
use floe::telemetry::scrape::Exposition;
use floe::telemetry::server::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH};
use floe_tests::faults::FaultProxy;
use floe_tests::{
    AgentProcess, Broker, PipelineSpec, Workspace, floe_bin, floe_cmd, free_port, repo_root,
};
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

/// `GET path` over HTTP/1.0: (status, body).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `GET path` until `accept(status, body)` holds; returns the last answer.
fn wait_for_http(
    addr: &str,
    path: &str,
    timeout: Duration,
    accept: impl Fn(u16, &str) -> bool,
) -> Result<(u16, String)> {
    let start = Instant::now();
    loop {
        let last = http_get(addr, path);
        if let Ok((status, body)) = &last
            && accept(*status, body)
        {
            return Ok((*status, body.clone()));
        }
        if start.elapsed() > timeout {
            bail!("{path} on {addr} after {timeout:?}: {last:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A one-pipeline config (pipeline `events`, 1 s commits) serving metrics on a free port.
fn config_with_metrics(
    ws: &Workspace,
    broker: &Broker,
    topic: &str,
    ready_commit_intervals: u32,
) -> Result<(std::path::PathBuf, String)> {
    let config = ws.write_config(&PipelineSpec {
        name: "events",
        bootstrap: &broker.bootstrap,
        topic,
        namespace: "ops",
        table: topic,
        commit_interval: "1s",
    })?;
    let addr = format!("127.0.0.1:{}", free_port());
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"{addr}\"\nready_commit_intervals = {ready_commit_intervals}\n{text}"
        ),
    )?;
    Ok((config, addr))
}

fn events(n: usize) -> Vec<floe_tests::Message> {
    (0..n)
        .map(|i| {
            (
                Some(format!("user-{}", i % 7).into_bytes()),
                Some(
                    json!({"id": i, "user": format!("user-{}", i % 7)})
                        .to_string()
                        .into_bytes(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_health_and_metrics_of_a_running_agent() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("clicks", 2).await?;
    let mut messages = events(300);
    messages.push((None, Some(b"not json".to_vec())));
    messages.push((None, Some(b"{\"unterminated\": ".to_vec())));
    broker.produce("clicks", &messages).await?;

    let ws = Workspace::new()?;
    let (config, addr) = config_with_metrics(&ws, &broker, "clicks", 3)?;
    let agent = AgentProcess::start(&config, &[])?;
    wait_for_http(&addr, HEALTHZ_PATH, Duration::from_secs(30), |s, _| {
        s == 200
    })?;
    ws.wait_for_rows("ops", "clicks", 300, Duration::from_secs(90))
        .await?;

    // Liveness, readiness.
    assert_eq!(http_get(&addr, HEALTHZ_PATH)?, (200, "ok\n".to_string()));
    let (_, ready) = wait_for_http(&addr, READYZ_PATH, Duration::from_secs(30), |s, _| s == 200)?;
    assert!(
        ready.starts_with("ready\nevents: ok (2 partitions, up to date "),
        "{ready}"
    );
    assert_eq!(http_get(&addr, "/nothing-here")?.0, 404);

    // Every family scraped is in the METRICS table with its type, and every per-pipeline
    // metric is there from the start.
    let (status, text) = http_get(&addr, METRICS_PATH)?;
    assert_eq!(status, 200);
    let scrape = Exposition::parse(&text)?;
    let mut seen = BTreeSet::new();
    for (name, kind) in scrape.families().filter(|(n, _)| n.starts_with("floe_")) {
        let def = METRICS
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("{name} is exported but not in telemetry::METRICS"))?;
        assert_eq!(kind, Some(def.kind.as_str()), "type of {name}");
        seen.insert(name);
    }
    // Every per-pipeline series is there from the start (maintenance only runs when
    // configured).
    let scheduled =
        |m: &&floe::telemetry::metric::MetricDef| !m.name.starts_with("floe_maintenance");
    for m in METRICS
        .iter()
        .filter(|m| m.labels == ["pipeline"])
        .filter(scheduled)
    {
        assert!(
            seen.contains(m.name),
            "{} missing from a real scrape:\n{text}",
            m.name
        );
    }
    let p = [("pipeline", "events")];
    // Series that have seen no event yet are exported at zero.
    assert_eq!(
        scrape.sum(
            "floe_dead_letters_total",
            &[("pipeline", "events"), ("stage", "key")]
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(scrape.sum("floe_build_info", &[]), Some(1.0), "{text}");
    // The standard process metrics, read at the scrape (CPU in whole seconds).
    for (name, least) in [
        ("process_resident_memory_bytes", 1.0),
        ("process_open_fds", 1.0),
        ("process_threads", 1.0),
        ("process_cpu_seconds_total", 0.0),
    ] {
        assert!(
            scrape.sum(name, &[]).is_some_and(|v| v >= least),
            "{name} missing or below {least}:\n{text}"
        );
    }
    assert_eq!(
        scrape.sum("floe_records_in_total", &p),
        Some(302.0),
        "{text}"
    );
    assert_eq!(
        scrape.sum("floe_records_out_total", &p),
        Some(300.0),
        "{text}"
    );
    assert_eq!(
        scrape.sum(
            "floe_dead_letters_total",
            &[("pipeline", "events"), ("stage", "decode")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        scrape.sum("floe_partitions_assigned", &p),
        Some(2.0),
        "{text}"
    );
    assert!(
        scrape
            .sum("floe_bytes_committed_total", &p)
            .is_some_and(|b| b > 0.0),
        "{text}"
    );

    // `floe top --once` renders the same figures as text.
    let (code, out, err) = floe_cmd(&[
        "top",
        "--once",
        "--metrics",
        &format!("http://{addr}"),
        "--interval",
        "1s",
        "--width",
        "140",
    ])?;
    println!("{out}");
    assert_eq!(code, 0, "{err}");
    let header = format!("floe top  http://{addr}/metrics  every 1s  READY");
    for needle in [
        header.as_str(),
        "PIPELINE",
        "LAST COMMIT",
        "DEAD LTR",
        "events: ok (2 partitions",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
    let row = out
        .lines()
        .find(|l| l.contains("│events "))
        .with_context(|| format!("no row for pipeline events:\n{out}"))?;
    let cells: Vec<&str> = row.trim_matches('│').split_whitespace().collect();
    // PIPELINE IN/S OUT/S LAG PARTS WAITING NEXT COMMIT(2 words) LAST COMMIT(2 words)
    // COMMITS FILES BYTES(2) DEAD ...
    assert_eq!(cells[0], "events", "{row}");
    assert_eq!(cells[4], "2", "partitions: {row}");
    assert_eq!(cells[5], "0", "rows waiting for a commit: {row}");
    assert!(
        cells[6] == "in" && cells[7].ends_with('s'),
        "next commit: {row}"
    );
    assert!(
        cells[8].ends_with('s') && cells[9] == "ago",
        "last commit: {row}"
    );
    assert_eq!(cells[14], "2", "dead letters: {row}");

    // An unreachable endpoint is a clear error.
    let (code, _, err) = floe_cmd(&[
        "top",
        "--once",
        "--metrics",
        &format!("127.0.0.1:{}", free_port()),
    ])?;
    assert_eq!(code, 1);
    assert!(
        err.contains("floe top: cannot read http://127.0.0.1:"),
        "{err}"
    );

    // stderr is a pipe here: plain log lines, no colours, no progress lines.
    let log = agent.terminate()?;
    assert!(!log.contains('\u{1b}'), "ANSI codes in a piped log:\n{log}");
    assert!(log.contains(" rows_written="), "{log}");
    assert!(
        !log.contains("rec/s"),
        "progress lines in a piped log:\n{log}"
    );
    Ok(())
}

/// A pipeline with nothing new to read stays ready: it is up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pipeline_stays_ready() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("quiet", 1).await?;
    broker.produce("quiet", &events(20)).await?;
    let ws = Workspace::new()?;
    let (config, addr) = config_with_metrics(&ws, &broker, "quiet", 2)?;
    let agent = AgentProcess::start(&config, &[])?;
    wait_for_http(&addr, READYZ_PATH, Duration::from_secs(60), |s, _| s == 200)?;
    // Idle for three times the readiness limit (2 intervals of 1 s).
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let (status, body) = http_get(&addr, READYZ_PATH)?;
        assert_eq!(status, 200, "an idle pipeline went not ready: {body}");
        std::thread::sleep(Duration::from_millis(250));
    }
    agent.terminate()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_at_boot_is_waited_for_quietly() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("late", 2).await?;
    broker.produce("late", &events(40)).await?;
    // The agent bootstraps through a proxy that refuses connections, as a broker that
    // is not up yet would.
    let proxy = FaultProxy::tcp(&broker.bootstrap)?;
    proxy.refuse();
    let ws = Workspace::new()?;
    let (config, addr) = config_with_metrics(&ws, &broker, "late", 2)?;
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(&config, text.replace(&broker.bootstrap, &proxy.address()))?;
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("waiting for the Kafka brokers", Duration::from_secs(60))?;
    let (status, body) = wait_for_http(&addr, READYZ_PATH, Duration::from_secs(10), |s, b| {
        s == 503 && b.contains("waiting")
    })?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains(&format!(
            "cannot reach Kafka brokers at {}",
            proxy.address()
        )),
        "{body}"
    );
    // Down for a while: still running, and a few lines, not hundreds.
    std::thread::sleep(Duration::from_secs(20));
    let out = agent.output();
    let client_errors = out.matches("Kafka client error").count();
    let waits = out.matches("waiting for the Kafka brokers").count();
    assert!(
        client_errors <= 3 && waits <= 8,
        "{client_errors} client errors, {waits} waits:\n{out}"
    );

    proxy.restore()?;
    ws.wait_for_rows("ops", "late", 40, Duration::from_secs(120))
        .await?;
    wait_for_http(&addr, READYZ_PATH, Duration::from_secs(60), |s, _| s == 200)?;
    agent.terminate()?;
    floe_tests::reference::assert_append_table(
        &broker.bootstrap,
        "late",
        40,
        "after the wait",
        |r| ws.read(r, "ops", "late", "_kafka_partition, _kafka_offset"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_when_commits_stall() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("stalls", 1).await?;
    broker.produce("stalls", &events(20)).await?;
    let ws = Workspace::new()?;
    let (config, addr) = config_with_metrics(&ws, &broker, "stalls", 2)?;
    // The failpoint parks the pipeline before it writes its first files: nothing commits.
    let mut agent = AgentProcess::start_at_failpoint(&config, "before_write", &[])?;
    agent.wait_for_failpoint(Duration::from_secs(60))?;
    let (status, body) = wait_for_http(&addr, READYZ_PATH, Duration::from_secs(20), |s, b| {
        s == 503 && b.contains("not up to date")
    })?;
    assert_eq!(status, 503);
    assert!(
        body.starts_with("not ready\nevents: tables not up to date for ")
            && body.contains("(limit 2s: 2 commit intervals of 1s)"),
        "{body}"
    );
    assert_eq!(
        http_get(&addr, HEALTHZ_PATH)?.0,
        200,
        "alive while not ready"
    );
    agent.kill9()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_beyond_the_partition_count_is_alive_but_not_ready() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("single", 1).await?;
    broker.produce("single", &events(50)).await?;
    let ws = Workspace::new()?;
    let (config_a, addr_a) = config_with_metrics(&ws, &broker, "single", 3)?;
    let config_b = ws.path("floe-b.toml");
    let addr_b = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &config_b,
        std::fs::read_to_string(&config_a)?.replace(&addr_a, &addr_b),
    )?;
    let a = AgentProcess::start(&config_a, &[])?;
    wait_for_http(&addr_a, HEALTHZ_PATH, Duration::from_secs(30), |s, _| {
        s == 200
    })?;
    wait_for_http(&addr_a, READYZ_PATH, Duration::from_secs(60), |s, _| {
        s == 200
    })?;
    // The second replica of the same pipeline logs JSON (as in the container image).
    let b = AgentProcess::start(&config_b, &[("FLOE_LOG_FORMAT", "json")])?;
    wait_for_http(&addr_b, HEALTHZ_PATH, Duration::from_secs(30), |s, _| {
        s == 200
    })?;

    // After the group settles, one agent owns the partition and is ready; the other is
    // alive, idle and not ready.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (ready, idle) = loop {
        let ra = http_get(&addr_a, READYZ_PATH)?;
        let rb = http_get(&addr_b, READYZ_PATH)?;
        let idle = |r: &(u16, String)| r.0 == 503 && r.1.contains("events: no partitions assigned");
        if ra.0 == 200 && idle(&rb) {
            break (addr_a.clone(), addr_b.clone());
        }
        if rb.0 == 200 && idle(&ra) {
            break (addr_b.clone(), addr_a.clone());
        }
        if Instant::now() > deadline {
            bail!("no stable owner/idle pair: a={ra:?} b={rb:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(http_get(&idle, HEALTHZ_PATH)?.0, 200);
    let partitions = |addr: &str| -> Result<Option<f64>> {
        let text = http_get(addr, METRICS_PATH)?.1;
        Ok(Exposition::parse(&text)?.sum("floe_partitions_assigned", &[("pipeline", "events")]))
    };
    assert_eq!(partitions(&ready)?, Some(1.0));
    assert_eq!(partitions(&idle)?, Some(0.0));

    let log_b = b.terminate()?;
    a.terminate()?;
    let mut messages = 0;
    for line in log_b.lines() {
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("not a JSON log line: {line:?}"))?;
        for key in ["timestamp", "level", "target"] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
        if v.get("message").is_some() {
            messages += 1;
        }
    }
    assert!(messages > 0, "{log_b}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floe_run_on_a_terminal_shows_one_progress_line_per_pipeline() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("tty", 1).await?;
    broker.produce("tty", &events(40)).await?;
    let ws = Workspace::new()?;
    let config = ws.write_config(&PipelineSpec {
        name: "events",
        bootstrap: &broker.bootstrap,
        topic: "tty",
        namespace: "ops",
        table: "tty",
        commit_interval: "1s",
    })?;
    // `script` (util-linux) runs the agent on a pseudo-terminal and copies what it shows.
    let inner = format!(
        "stty cols 160 rows 40; timeout -s INT 15 {} run --config {}",
        floe_bin().display(),
        config.display()
    );
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &inner, "/dev/null"])
        .output()
        .context("run script(1) from util-linux")?;
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        screen.contains("[events] ")
            && screen.contains(" rec/s in, ")
            && screen.contains("rows committed"),
        "no progress line on a terminal:\n{screen}"
    );
    assert!(screen.contains("40 rows committed"), "{screen}");
    assert!(
        screen.contains("\u{1b}["),
        "a terminal gets colours and cursor moves:\n{screen}"
    );
    assert_eq!(ws.committed_rows("ops", "tty").await?, 40);
    Ok(())
}

/// Metric names (`floe_...`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("floe_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The METRICS entry a series name belongs to (histograms have `_bucket`/`_sum`/`_count`).
fn exported(series: &str) -> Option<&'static floe::telemetry::metric::MetricDef> {
    METRICS.iter().find(|m| {
        m.name == series
            || (m.kind == MetricKind::Histogram
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| series.strip_suffix(s) == Some(m.name)))
    })
}

#[test]
fn dashboard_and_alert_rules_use_only_exported_metrics() -> Result<()> {
    let path = repo_root().join("examples/grafana/floe.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut used = BTreeSet::new();
    let mut titles = Vec::new();
    let panels = dashboard["panels"].as_array().context("panels")?;
    for panel in panels {
        titles.push(panel["title"].as_str().unwrap_or_default().to_string());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().context("target without expr")?;
            for name in metric_names(expr) {
                let def = exported(&name).with_context(|| {
                    format!(
                        "panel {:?} uses {name}, which the agent does not export",
                        panel["title"]
                    )
                })?;
                used.insert(def.name);
            }
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for name in metric_names(var["definition"].as_str().unwrap_or_default()) {
            assert!(exported(&name).is_some(), "variable uses {name}");
        }
    }
    // Every exported metric is on the dashboard.
    for m in METRICS {
        assert!(used.contains(m.name), "{} is not on the dashboard", m.name);
    }
    // The panels an operator needs first (throughput, lag, commit age, ...), and the
    // commit-age threshold the alert uses.
    for title in [
        "Throughput",
        "Consumer lag",
        "Commit age",
        "Dead letters by stage",
        "Plugin CPU (cores)",
        "Plugin time per record",
    ] {
        assert!(
            titles.iter().any(|t| t == title),
            "no panel {title:?}: {titles:?}"
        );
    }
    let commit_age = panels
        .iter()
        .find(|p| p["title"] == "Commit age")
        .context("commit age panel")?;
    let steps = commit_age["fieldConfig"]["defaults"]["thresholds"]["steps"]
        .as_array()
        .context("commit age thresholds")?;
    let threshold = steps
        .last()
        .and_then(|s| s["value"].as_f64())
        .context("a threshold value")?;
    assert_eq!(
        commit_age["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"],
        "line+area"
    );

    let rules_text = std::fs::read_to_string(repo_root().join("examples/grafana/alerts.yaml"))?;
    let rules = YamlLoader::load_from_str(&rules_text)?;
    let mut alerts = Vec::new();
    for group in rules[0]["groups"].as_vec().context("groups")? {
        for rule in group["rules"].as_vec().context("rules")? {
            let expr = rule["expr"].as_str().context("expr")?;
            for name in metric_names(expr) {
                assert!(
                    exported(&name).is_some(),
                    "alert {:?} uses {name}",
                    rule["alert"]
                );
            }
            alerts.push((
                rule["alert"].as_str().context("alert name")?.to_string(),
                expr.to_string(),
            ));
        }
    }
    let stale = alerts
        .iter()
        .find(|(a, _)| a == "FloeCommitStale")
        .context("FloeCommitStale alert")?;
    assert!(
        stale.1.contains("floe_seconds_since_last_commit")
            && stale.1.ends_with(&format!("> {threshold}")),
        "the alert and the dashboard threshold ({threshold}) differ: {}",
        stale.1
    );
    Ok(())
}

/// Resolves a probe's port (a number or a container port name).
fn probe_port(container: &Yaml, probe: &str) -> Result<i64> {
    let port = &container[probe]["httpGet"]["port"];
    if let Some(n) = port.as_i64() {
        return Ok(n);
    }
    let name = port.as_str().with_context(|| format!("{probe} port"))?;
    container["ports"]
        .as_vec()
        .context("ports")?
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_i64())
        .with_context(|| format!("no container port named {name}"))
}

#[test]
fn container_and_kubernetes_files_match_the_agent() -> Result<()> {
    let root = repo_root();
    let docs = YamlLoader::load_from_str(&std::fs::read_to_string(
        root.join("examples/deploy/kubernetes.yaml"),
    )?)?;
    let kind = |k: &str| docs.iter().find(|d| d["kind"].as_str() == Some(k));
    let config_map = kind("ConfigMap").context("a ConfigMap")?;
    let secret = kind("Secret").context("a Secret")?;
    let deployment = kind("Deployment").context("a Deployment")?;
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];

    // The config in the ConfigMap passes `floe validate` with the Deployment's environment.
    let config_text = config_map["data"]["floe.toml"]
        .as_str()
        .context("data floe.toml")?;
    let ws = Workspace::new()?;
    let config_path = ws.path("floe.toml");
    std::fs::write(&config_path, config_text)?;
    let mut validate = Command::new(floe_bin());
    validate.args(["validate", "--config"]).arg(&config_path);
    let secret_keys: Vec<&str> = secret["stringData"]
        .as_hash()
        .context("stringData")?
        .keys()
        .filter_map(Yaml::as_str)
        .collect();
    for env in container["env"].as_vec().context("env")? {
        let name = env["name"].as_str().context("env name")?;
        let value = match env["value"].as_str() {
            Some(v) => v.to_string(),
            None => {
                let r = &env["valueFrom"]["secretKeyRef"];
                assert_eq!(
                    r["name"], secret["metadata"]["name"],
                    "{name} refers to another Secret"
                );
                let key = r["key"].as_str().context("secret key")?;
                assert!(
                    secret_keys.contains(&key),
                    "{name}: no key {key} in the Secret"
                );
                format!("secret-{key}")
            }
        };
        validate.env(name, value);
    }
    let out = validate.output()?;
    assert!(
        out.status.success(),
        "the ConfigMap's config does not validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let config: toml::Value = toml::from_str(config_text)?;
    let listen = config["metrics"]["listen"]
        .as_str()
        .context("[metrics] listen")?;
    let port: i64 = listen.rsplit(':').next().context("port")?.parse()?;
    assert!(
        listen.starts_with("0.0.0.0:"),
        "a pod must listen on all interfaces: {listen}"
    );

    // Probes and scrape annotations point at the agent's endpoints on that port.
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some(HEALTHZ_PATH)
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some(READYZ_PATH)
    );
    assert_eq!(probe_port(container, "livenessProbe")?, port);
    assert_eq!(probe_port(container, "readinessProbe")?, port);
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(port.to_string().as_str())
    );
    assert_eq!(
        annotations["prometheus.io/path"].as_str(),
        Some(METRICS_PATH)
    );
    assert!(
        deployment["spec"]["replicas"]
            .as_i64()
            .is_some_and(|r| r >= 1)
    );

    // The config file is where the container reads it, files the config names are mounted.
    let args: Vec<&str> = container["args"]
        .as_vec()
        .context("args")?
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let config_arg = args
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| w[1])
        .context("--config in args")?;
    let mounts = container["volumeMounts"].as_vec().context("volumeMounts")?;
    let volumes = pod["spec"]["volumes"].as_vec().context("volumes")?;
    let mounted = |path: &str| -> Option<(&Yaml, String)> {
        let m = mounts.iter().find(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|mp| Path::new(path).parent() == Some(Path::new(mp)))
        })?;
        let v = volumes.iter().find(|v| v["name"] == m["name"])?;
        let file = Path::new(path).file_name()?.to_str()?.to_string();
        Some((v, file))
    };
    let (volume, file) =
        mounted(config_arg).context("the --config file is not on a mounted volume")?;
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
    assert!(config_map["data"][file.as_str()].as_str().is_some());
    let credential_file = config["catalogs"]["lake"]["credential_file"]
        .as_str()
        .context("credential_file")?;
    let (volume, file) =
        mounted(credential_file).context("credential_file is not on a mounted volume")?;
    assert_eq!(volume["secret"]["secretName"], secret["metadata"]["name"]);
    assert!(
        secret_keys.contains(&file.as_str()),
        "no {file} in the Secret"
    );

    // The image: built with the project's release command, run as the pod's non-root user,
    // with the same default config path.
    let dockerfile = std::fs::read_to_string(root.join("examples/deploy/Dockerfile"))?;
    let build_cmd = "cargo build --locked --release -p floe-agent --bin floe";
    assert!(
        dockerfile.contains(build_cmd),
        "the build stage does not run `{build_cmd}`"
    );
    let demo = std::fs::read_to_string(root.join("scripts/demo.sh"))?;
    assert!(
        demo.contains(build_cmd),
        "scripts/demo.sh builds the release binary differently"
    );
    assert!(dockerfile.contains("target/release/floe"));
    let agent_manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("agent/Cargo.toml"))?)?;
    assert!(
        agent_manifest["bin"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|b| b["name"].as_str() == Some("floe")),
        "agent/Cargo.toml has no [[bin]] floe"
    );
    let toolchain: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("rust-toolchain.toml"))?)?;
    let channel = toolchain["toolchain"]["channel"]
        .as_str()
        .context("channel")?;
    assert!(
        dockerfile.contains(&format!("ARG RUST_VERSION={channel}\n")),
        "the build image's Rust is not the toolchain's {channel}"
    );
    let user = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .context("USER")?;
    let uid: i64 = user.split(':').next().context("uid")?.parse()?;
    assert_ne!(uid, 0);
    let security = &pod["spec"]["securityContext"];
    assert_eq!(security["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(security["runAsUser"].as_i64(), Some(uid));
    assert!(
        dockerfile.contains(&format!("CMD [\"run\", \"--config\", \"{config_arg}\"]")),
        "the image's default config path differs from the Deployment's"
    );
    Ok(())
}
