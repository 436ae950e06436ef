//! The `floe` command: config validation and clear startup failures.

use std::time::Duration;

use anyhow::Result;
use floe_tests::{AgentProcess, Broker, PipelineSpec, Workspace, floe_cmd, repo_root};

#[test]
fn validate_lists_every_error_with_its_path() -> Result<()> {
    let ws = Workspace::new()?;
    let path = ws.path("broken.toml");
    std::fs::write(
        &path,
        r#"
[catalogs.local]
type = "embedded"
path = "c.db"
warehouse = "w"
[[pipelines]]
name = "p"
[pipelines.source]
bootstrap_servers = "b:9092"
group_id = "g"
topics = ["t"]
security_protocol = "SASL_SSL"
[pipelines.sink]
catalog = "missing"
namespace = "n"
table = "t"
commit_interval = "200ms"
flush_bytes = "lots"
"#,
    )?;
    let (code, _, stderr) = floe_cmd(&["validate", "--config", path.to_str().unwrap()])?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("pipelines[0].sink.flush_bytes"), "{stderr}");
    // flush_bytes is a deserialization error: the sink section stops there, the source section is still checked.
    assert!(
        stderr.contains("pipelines[0].source.sasl: required with SASL_PLAINTEXT and SASL_SSL"),
        "{stderr}"
    );

    std::fs::write(
        &path,
        std::fs::read_to_string(&path)?.replace("flush_bytes = \"lots\"\n", ""),
    )?;
    let (code, _, stderr) = floe_cmd(&["validate", "--config", path.to_str().unwrap()])?;
    assert_eq!(code, 2);
    for expected in [
        "pipelines[0].source.sasl",
        "pipelines[0].sink.catalog",
        "pipelines[0].sink.commit_interval",
        "3 configuration error(s)",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }

    // Every config under examples/ passes `floe validate` (its ${VARS} given values).
    let mut checked = 0;
    let mut dirs = vec![repo_root().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let mut cmd = std::process::Command::new(floe_tests::floe_bin());
            cmd.args(["validate", "--config"]).arg(&path);
            for var in text.split("${").skip(1).filter_map(|r| r.split_once('}')) {
                cmd.env(var.0, "127.0.0.1:9092");
            }
            let out = cmd.output()?;
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} example configs found");
    Ok(())
}

#[test]
fn validate_refuses_what_run_would_refuse_and_warns_as_run_does() -> Result<()> {
    let ws = Workspace::new()?;
    let path = ws.path("config.toml");
    let good = r#"
[catalogs.local]
type = "embedded"
path = "c.db"
warehouse = "w"
[[pipelines]]
name = "p"
[pipelines.source]
bootstrap_servers = "b:9092"
group_id = "g"
topics = ["t"]
[[pipelines.transforms]]
uses = "no-such-plugin"
[pipelines.sink]
catalog = "local"
namespace = "n"
table = "t"
commit_interval = "5s"
flush_bytes = "64MiB"
"#;
    let validate = |text: &str| -> Result<(i32, String, String)> {
        std::fs::write(&path, text)?;
        floe_cmd(&["validate", "--config", path.to_str().unwrap()])
    };
    // "line N" of the first line of `text` that holds `needle`.
    let line = |text: &str, needle: &str| {
        let n = text.lines().position(|l| l.contains(needle)).expect(needle);
        format!("line {}, column 1", n + 1)
    };
    let (code, _, stderr) = validate(good)?;
    assert_eq!(code, 2, "{stderr}");
    let uses = line(good, "uses =");
    assert!(
        stderr.contains(&format!(
            "{uses}: pipelines[0].transforms[0].uses: no plugin file"
        )) && stderr.contains("no-such-plugin.wasm"),
        "{stderr}"
    );
    let flush = line(good, "flush_bytes");
    assert!(
        stderr.contains(&format!(
            "warning: {flush}: pipelines[0].sink.flush_bytes: no longer used"
        )),
        "{stderr}"
    );

    let (code, _, stderr) = validate(
        &good
            .replace("\"5s\"", "\"500000000000y\"")
            .replace("table = \"t\"", "table = \"a/b\"")
            .replace("topics = [\"t\"]", "topic = [\"t\"]"),
    )?;
    assert_eq!(code, 2, "{stderr}");
    for expected in [
        format!(
            "{}: pipelines[0].source.topic: unknown key `topic`; did you mean `topics`?",
            line(good, "topics")
        ),
        format!(
            "{}: pipelines[0].sink.table: \"a/b\" holds a path separator",
            line(good, "table =")
        ),
        format!(
            "{}: pipelines[0].sink.commit_interval: duration \"500000000000y\" is too long",
            line(good, "commit_interval")
        ),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }

    let (code, _, stderr) = validate("[[pipelines]\nname = \"p\"\n")?;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("line 1, column") && stderr.contains("not valid TOML"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn a_new_plugin_finds_the_sdk_of_its_checkout_or_says_what_to_pass() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let new = |cwd: &std::path::Path, name: &str| -> Result<std::process::Output> {
        Ok(std::process::Command::new(floe_tests::floe_bin())
            .args(["plugin", "new", name, "--dir"])
            .arg(dir.path())
            .current_dir(cwd)
            .env_remove("FLOE_SDK_PATH")
            .output()?)
    };
    let outside = new(dir.path(), "outside")?;
    let stderr = String::from_utf8_lossy(&outside.stderr);
    assert!(outside.status.success(), "{stderr}");
    assert!(stderr.contains("--sdk-path"), "{stderr}");
    let inside = new(&repo_root(), "inside")?;
    let stdout = String::from_utf8_lossy(&inside.stdout);
    assert!(stdout.contains("floe-sdk from"), "{stdout}");
    let manifest = std::fs::read_to_string(dir.path().join("inside/Cargo.toml"))?;
    assert!(manifest.contains("path = "), "{manifest}");
    Ok(())
}

#[test]
fn run_names_an_unusable_catalog_and_a_missing_table() -> Result<()> {
    let ws = Workspace::new()?;
    let broker = Broker::start()?;
    let config = ws.write_config(&PipelineSpec {
        name: "p",
        bootstrap: &broker.bootstrap,
        topic: "t",
        namespace: "n",
        table: "t",
        commit_interval: "1s",
    })?;
    let text = std::fs::read_to_string(&config)?;

    // A catalog file that cannot be created.
    std::fs::write(
        &config,
        text.replace(
            &format!("{}/catalog.db", ws.dir.path().display()),
            "/proc/floe-no/catalog.db",
        ),
    )?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success());
    assert!(out.contains("/proc/floe-no"), "{out}");

    // A table that does not exist, with creation off.
    std::fs::write(
        &config,
        text.replace("create_table = true", "create_table = false"),
    )?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success());
    assert!(
        out.contains("table n.t does not exist; create it or set `create_table = true`"),
        "{out}"
    );
    Ok(())
}

#[test]
fn a_scaffolded_plugin_builds_passes_its_tests_and_runs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sdk = repo_root().join("sdk");
    let (code, stdout, stderr) = floe_cmd(&[
        "plugin",
        "new",
        "drop-email",
        "--dir",
        dir.path().to_str().unwrap(),
        "--sdk-path",
        sdk.to_str().unwrap(),
    ])?;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("created"), "{stdout}");
    let crate_dir = dir.path().join("drop-email");
    // Its own target dir, kept between runs (the SDK and serde_json compile once).
    let target = std::env::var("FLOE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir())
        .join("target-scaffold");
    let cargo = |args: &[&str]| -> Result<()> {
        let out = std::process::Command::new("cargo")
            .args(args)
            .current_dir(&crate_dir)
            .env("CARGO_TARGET_DIR", &target)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "cargo {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    cargo(&["test"])?;
    cargo(&["build", "--release", "--target", "wasm32-wasip2"])?;
    let wasm = target.join("wasm32-wasip2/release/drop_email.wasm");
    let (code, stdout, stderr) = floe_cmd(&[
        "plugin",
        "test",
        wasm.to_str().unwrap(),
        "--input",
        crate_dir.join("sample.ndjson").to_str().unwrap(),
    ])?;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(r#"#0 -> {"id":1}"#), "{stdout}");
    assert!(
        stdout.contains("2 in, 2 out, 0 dropped, 0 errors"),
        "{stdout}"
    );

    // A plugin's per-record error is shown, and the exit code says so.
    std::fs::write(dir.path().join("bad.ndjson"), "{\"id\": 1}\n[1]\n")?;
    let (code, stdout, _) = floe_cmd(&[
        "plugin",
        "test",
        wasm.to_str().unwrap(),
        "--input",
        dir.path().join("bad.ndjson").to_str().unwrap(),
    ])?;
    assert_eq!(code, 3);
    assert!(
        stdout.contains("#1 !! error: input is not a JSON object"),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn core_modules_for_wasip1_and_unknown_unknown_are_accepted() -> Result<()> {
    let input = repo_root().join("examples/data/events.ndjson");
    for name in ["passthrough-wasip1", "passthrough-unknown-unknown"] {
        let plugin = floe_tests::plugin_path(name);
        let (code, stdout, stderr) = floe_cmd(&[
            "plugin",
            "test",
            plugin.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ])?;
        // The sample holds 2 malformed lines on purpose: the plugin reports them as record errors.
        assert_eq!(code, 3, "{name}: {stderr}");
        assert!(
            stdout.contains("502 in, 500 out, 0 dropped, 2 errors"),
            "{name}: {stdout}"
        );
    }
    Ok(())
}
