//! Plugin author tools behind `floe plugin new` and `floe plugin test`.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::engine::{PluginsConfig, TransformEngine};
use super::plugin::{Input, Metadata, Outcome, PluginInstance};
use super::{Limits, OnError, TransformConfig, TransformError};

/// Creates a plugin crate at `dir/name` that builds and passes its tests as it is.
/// `sdk` is how the crate finds `floe-sdk` (a path to the SDK folder).
pub fn scaffold(dir: &Path, name: &str, sdk: &Path) -> std::io::Result<PathBuf> {
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
    let sdk = std::path::absolute(sdk)?;
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
floe-sdk = {{ path = "{sdk}" }}

# Its own workspace, so it builds wherever it is created.
[workspace]

[profile.release]
strip = true
opt-level = "s"
"#,
            sdk = sdk.display()
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
    std::fs::write(
        root.join("README.md"),
        format!(
            "# {name}\n\nA Floe transform plugin.\n\n```sh\ncargo test                                      # native unit tests\ncargo build --release --target wasm32-wasip2    # target/wasm32-wasip2/release/{ident}.wasm\nfloe plugin test target/wasm32-wasip2/release/{ident}.wasm --input sample.ndjson\n```\n\nUse it in a pipeline:\n\n```toml\n[[pipelines.transforms]]\nuses = \"path/to/{ident}.wasm\"\nwith = {{ field = \"email\" }}\n```\n"
        ),
    )?;
    std::fs::write(
        root.join("src/lib.rs"),
        r#"//! A Floe transform plugin: removes one field (`with = { field = "email" }`) from every record.

use floe_sdk::{Config, Emit, Record, Transform};

/// The plugin's state, built once from its config.
pub struct Plugin {
    field: String,
}

impl Transform for Plugin {
    fn init(config: &Config) -> Result<Self, String> {
        Ok(Plugin { field: config.str_or("field", "email")?.to_string() })
    }

    fn process(&mut self, mut record: Record) -> Result<Vec<Emit>, String> {
        record.value.remove(&self.field);
        Ok(vec![Emit::new(record.value)])
    }
}

floe_sdk::export_transform!(Plugin);

#[cfg(test)]
mod tests {
    use floe_sdk::json;
    use floe_sdk::testing::{Harness, object};

    use super::*;

    #[test]
    fn removes_the_field() {
        let mut plugin = Harness::<Plugin>::new(json!({"field": "email"})).unwrap();
        let out = plugin.run(json!({"id": 1, "email": "a@example.com"})).unwrap();
        assert_eq!(out, vec![Emit::new(object(json!({"id": 1})))]);
    }
}
"#,
    )?;
    Ok(root)
}

/// Counts of a `floe plugin test` run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestSummary {
    /// Records read from the input file.
    pub records_in: usize,
    /// Records emitted.
    pub records_out: usize,
    /// Inputs that produced nothing.
    pub dropped: usize,
    /// Inputs the plugin returned an error for.
    pub errors: usize,
}

/// Runs a plugin over an NDJSON file and writes what happens to each record to `out`.
pub fn test_plugin(
    uses: &str,
    with: &str,
    limits: Limits,
    input: &Path,
    out: &mut dyn std::io::Write,
) -> Result<TestSummary, TransformError> {
    let plugins = PluginsConfig {
        path: vec![PathBuf::from(".")],
        cache_dir: std::env::temp_dir().join("floe-plugin-test-cache"),
    };
    let engine = TransformEngine::new(&plugins, 1, limits.memory)?;
    let with: toml::Value = serde_json::from_str(with)
        .map_err(|e| TransformError::Engine(format!("--with is not JSON: {e}")))?;
    let config = TransformConfig {
        uses: uses.to_string(),
        name: None,
        with: with.into(),
        limits,
        on_error: OnError::DeadLetter,
        allow_clock: false,
    };
    let component = engine.load(&config)?;
    let mut plugin = PluginInstance::new(&engine, &config, component)?;
    let file = std::fs::File::open(input)
        .map_err(|e| TransformError::Engine(format!("{}: {e}", input.display())))?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|e| TransformError::Engine(format!("{}: {e}", input.display())))?;
    let inputs: Vec<Input> = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| Input {
            value: l.as_bytes().to_vec(),
            metadata: Metadata {
                topic: "test".into(),
                partition: 0,
                offset: i as i64,
                timestamp_ms: None,
                key: None,
            },
        })
        .collect();
    let mut summary = TestSummary {
        records_in: inputs.len(),
        ..TestSummary::default()
    };
    for chunk in inputs.chunks(limits.batch.max(1)) {
        for (input, outcome) in chunk.iter().zip(plugin.process(chunk)?) {
            let n = input.metadata.offset;
            let _ = match outcome {
                Outcome::Emit(outputs) if outputs.is_empty() => {
                    summary.dropped += 1;
                    writeln!(out, "#{n} -> (dropped)")
                }
                Outcome::Emit(outputs) => {
                    summary.records_out += outputs.len();
                    let mut r = Ok(());
                    for o in outputs {
                        let stream = o
                            .route
                            .map(|s| format!("  [stream {s}]"))
                            .unwrap_or_default();
                        r = writeln!(out, "#{n} -> {}{stream}", String::from_utf8_lossy(&o.value));
                    }
                    r
                }
                Outcome::Error(message) => {
                    summary.errors += 1;
                    writeln!(out, "#{n} !! error: {message}")
                }
            };
        }
    }
    let _ = writeln!(
        out,
        "{} in, {} out, {} dropped, {} errors",
        summary.records_in, summary.records_out, summary.dropped, summary.errors
    );
    Ok(summary)
}
