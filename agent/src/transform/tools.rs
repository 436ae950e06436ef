//! Plugin author tools behind `floe plugin new` and `floe plugin test`.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::chain::{ChainInput, Produced, TransformChain};
use super::engine::{PluginsConfig, TransformEngine};
use super::{Limits, OnError, TransformConfig, TransformError};
use crate::record::json::JsonObject;

/// The floe-sdk version a new plugin depends on.
pub const SDK_VERSION: &str = "0.2";

/// The `sdk/` folder of the Floe checkout that holds the current directory, if any.
pub fn find_sdk() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().map(|d| d.join("sdk")).find(|sdk| {
        std::fs::read_to_string(sdk.join("Cargo.toml"))
            .is_ok_and(|text| text.contains("name = \"floe-sdk\""))
    })
}

/// Creates a plugin crate at `dir/name` that builds and passes its tests as it is.
/// It depends on `floe-sdk` by version; `sdk` (a path to the SDK folder) is added as a
/// path override, for working on Floe itself.
pub fn scaffold(dir: &Path, name: &str, sdk: Option<&Path>) -> std::io::Result<PathBuf> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !valid {
        return Err(std::io::Error::other(
            "plugin name: use lowercase letters, digits, '-' and '_'",
        ));
    }
    let root = dir.join(name);
    if root.exists() {
        return Err(std::io::Error::other(format!(
            "{} already exists",
            root.display()
        )));
    }
    let sdk_dependency = match sdk {
        Some(path) => format!(
            "{{ version = \"{SDK_VERSION}\", path = \"{}\" }}",
            std::path::absolute(path)?.display()
        ),
        None => format!("\"{SDK_VERSION}\""),
    };
    std::fs::create_dir_all(root.join("src"))?;
    let ident = name.replace('-', "_");
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
floe-sdk = {sdk_dependency}
serde = {{ version = "1", features = ["derive"] }}

# Its own workspace, so it builds wherever it is created.
[workspace]

[profile.release]
strip = true
codegen-units = 1
"#
        ),
    )?;
    std::fs::write(
        root.join("rust-toolchain.toml"),
        "[toolchain]\nchannel = \"1.95.0\"\ntargets = [\"wasm32-wasip2\"]\n",
    )?;
    std::fs::write(root.join(".gitignore"), "/target\n")?;
    std::fs::write(
        root.join("sample.ndjson"),
        "{\"id\": 1, \"email\": \"a@example.com\"}\n{\"id\": 2}\n",
    )?;
    std::fs::write(root.join("README.md"), scaffold_readme(name, &ident))?;
    std::fs::write(root.join("src/lib.rs"), SCAFFOLD_LIB)?;
    Ok(root)
}

fn scaffold_readme(name: &str, ident: &str) -> String {
    format!(
        r#"# {name}

A Floe transform plugin: it removes one field (`email` unless configured) from every
record. Edit `src/lib.rs`; the `floe-sdk` docs show the other shapes (`#[filter]`,
`#[flat_map]`) and what a plugin may and may not do.

## Build and test

```sh
rustup target add wasm32-wasip2                 # once
cargo test                                      # unit tests, natively
cargo build --release --target wasm32-wasip2    # -> target/wasm32-wasip2/release/{ident}.wasm
floe plugin test target/wasm32-wasip2/release/{ident}.wasm --input sample.ndjson --with '{{"field": "email"}}'
```

`floe plugin test` runs the built component in the agent's own sandbox (the same
code path as `floe run`) and prints what each record becomes.

## Load it

Copy the `.wasm` file where the agent can read it and name it in a pipeline:

```toml
[[pipelines.transforms]]
uses = "/path/to/{ident}.wasm"     # or "{ident}" when the file is in [plugins] path
with = {{ field = "email" }}
on_error = "dead_letter"           # dead_letter (default) | drop | fail
limits = {{ timeout = "5s", memory = "64MiB" }}
```

`floe check --config ...` loads and initialises it with its `with` table and reports
any problem before you run.
"#
    )
}

const SCAFFOLD_LIB: &str = r#"//! A Floe transform plugin: removes one field from every record that has it.

use floe_sdk::{Patch, Record, map};
use serde::Deserialize;

/// The plugin's settings: the pipeline's `with` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// The field to remove, a dotted path such as `user.email` (default `email`).
    #[serde(default = "default_field")]
    field: String,
}

fn default_field() -> String {
    "email".to_string()
}

/// Removes the field. An empty patch leaves the record unchanged.
#[map]
fn drop_field(record: &Record, config: &Config) -> Patch {
    match record.get(config.field.as_str()) {
        Some(_) => Patch::new().remove(config.field.as_str()),
        None => Patch::new(),
    }
}

#[cfg(test)]
mod tests {
    use floe_sdk::json;
    use floe_sdk::testing::{Harness, Output, object};

    use super::*;

    #[test]
    fn removes_the_field() {
        let mut plugin = Harness::<Plugin>::new(json!({"field": "email"})).unwrap();
        let out = plugin.run(json!({"id": 1, "email": "a@example.com"})).unwrap();
        assert_eq!(out, vec![Output::new(object(json!({"id": 1})))]);
        assert_eq!(plugin.run_one(json!({"id": 2})), json!({"id": 2}));
    }

    #[test]
    fn refuses_unknown_settings() {
        let e = Harness::<Plugin>::init_error(json!({"feild": "x"}));
        assert!(e.contains("unknown field `feild`"), "{e}");
    }
}
"#;

/// Counts of a `floe plugin test` run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestSummary {
    /// Records read from the input file.
    pub records_in: usize,
    /// Records emitted.
    pub records_out: usize,
    /// Inputs that produced nothing.
    pub dropped: usize,
    /// Inputs that are not JSON objects, and inputs the plugin returned an error for
    /// (or faulted on).
    pub errors: usize,
}

/// Where `floe plugin test` caches compiled plugins: this user's cache directory
/// (`$XDG_CACHE_HOME/floe/plugin-test`, else `~/.cache/floe/plugin-test`), or a
/// directory named after the user id in the temporary directory (checked to be this
/// user's own before it is used, like every plugin cache).
pub fn user_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|d| !d.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    match base {
        Some(base) => base.join("floe").join("plugin-test"),
        None => {
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            std::env::temp_dir().join(format!("floe-plugin-test-{uid}"))
        }
    }
}

/// Runs a plugin over an NDJSON file through the same chain `floe run` uses, and
/// writes what happens to each record to `out`.
pub fn test_plugin(
    uses: &str,
    with: &str,
    limits: Limits,
    input: &Path,
    out: &mut dyn std::io::Write,
) -> Result<TestSummary, TransformError> {
    let plugins = PluginsConfig {
        path: vec![PathBuf::from(".")],
        cache_dir: user_cache_dir(),
    };
    let engine = TransformEngine::counting_fuel(&plugins, 1, limits.memory, limits.fuel.is_some())?;
    let with: toml::Value = serde_json::from_str(with)
        .map_err(|e| TransformError::Engine(format!("--with is not JSON: {e}")))?;
    let config = TransformConfig {
        uses: uses.to_string(),
        name: None,
        with: with.into(),
        limits,
        on_error: OnError::DeadLetter,
        allow_clock: false,
        allow_random: false,
    };
    let mut chain = TransformChain::new("plugin-test", &engine, std::slice::from_ref(&config))?;
    let file = std::fs::File::open(input)
        .map_err(|e| TransformError::Engine(format!("{}: {e}", input.display())))?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|e| TransformError::Engine(format!("{}: {e}", input.display())))?;
    let lines: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
    let mut summary = TestSummary {
        records_in: lines.len(),
        ..TestSummary::default()
    };
    // Like the pipeline: only JSON objects reach the chain.
    let mut parsed = Vec::new();
    let mut bad: Vec<(usize, String)> = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        match JsonObject::parse(line.as_bytes().to_vec()) {
            Ok(o) => parsed.push((n, o)),
            Err(e) => bad.push((n, format!("input is not a JSON object: {e}"))),
        }
    }
    let inputs: Vec<ChainInput<'_>> = parsed
        .iter()
        .map(|(n, value)| ChainInput {
            value: value.view(),
            topic: "test",
            partition: 0,
            offset: *n as i64,
            timestamp_ms: None,
            key: None,
        })
        .collect();
    let result = chain.run(&inputs)?;
    let compact = |bytes: &[u8]| -> String {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned())
    };
    let mut lines_out: Vec<(usize, String)> = Vec::new();
    let mut produced = vec![false; inputs.len()];
    for o in &result.outputs {
        produced[o.origin] = true;
        summary.records_out += 1;
        let bytes = match &o.value {
            Produced::Unchanged => inputs[o.origin].value.bytes(),
            Produced::New(v) => v.as_bytes(),
        };
        let stream = o
            .route
            .as_ref()
            .map(|s| format!("  [stream {s}]"))
            .unwrap_or_default();
        lines_out.push((parsed[o.origin].0, format!("-> {}{stream}", compact(bytes))));
    }
    let mut failed = vec![false; inputs.len()];
    for e in &result.errors {
        failed[e.origin] = true;
        summary.errors += 1;
        lines_out.push((parsed[e.origin].0, format!("!! error: {}", e.message)));
    }
    for (i, (n, _)) in parsed.iter().enumerate() {
        if !produced[i] && !failed[i] {
            summary.dropped += 1;
            lines_out.push((*n, "-> (dropped)".to_string()));
        }
    }
    for (n, message) in bad {
        summary.errors += 1;
        lines_out.push((n, format!("!! error: {message}")));
    }
    lines_out.sort_by_key(|(n, _)| *n);
    for (n, line) in lines_out {
        let _ = writeln!(out, "#{n} {line}");
    }
    let _ = writeln!(
        out,
        "{} in, {} out, {} dropped, {} errors",
        summary.records_in, summary.records_out, summary.dropped, summary.errors
    );
    Ok(summary)
}
