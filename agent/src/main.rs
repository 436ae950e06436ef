//! The `floe` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use floe::config::Config;

/// Floe: Kafka topics into Apache Iceberg tables, exactly once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every pipeline of a config until SIGINT or SIGTERM.
    Run {
        /// Config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check a config file and list every problem in it.
    Validate {
        /// Config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Try every pipeline's catalog, table, storage and broker with the configured
    /// credentials; one pass/fail line per step, exit code 1 if any failed.
    Check {
        /// Config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Tools for plugin authors.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Create a plugin crate that builds and passes its tests as it is (it depends on
    /// floe-sdk by version).
    New {
        /// Crate name (lowercase letters, digits, '-' and '_').
        name: String,
        /// Directory to create it in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Use the floe-sdk crate at this path instead of the published one (for
        /// working on Floe itself).
        #[arg(long, env = "FLOE_SDK_PATH")]
        sdk_path: Option<PathBuf>,
    },
    /// Run a built plugin (.wasm) on records from an NDJSON file, in the agent's
    /// sandbox and through the same chain as `floe run`, and print what it emits.
    Test {
        /// Path of the .wasm component (or a plugin name found in FLOE_PLUGIN_PATH).
        plugin: String,
        /// NDJSON file, one JSON object per line.
        #[arg(long)]
        input: PathBuf,
        /// The plugin's `with` settings, as JSON.
        #[arg(long, default_value = "{}")]
        with: String,
        /// Fuel per batch.
        #[arg(long, default_value_t = 10_000_000_000)]
        fuel: u64,
        /// Memory limit in bytes.
        #[arg(long, default_value_t = 64 << 20)]
        memory: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { config } => match Config::load(&config) {
            Ok(c) => {
                println!(
                    "{}: ok ({} pipeline(s), {} catalog(s))",
                    config.display(),
                    c.pipelines.len(),
                    c.catalogs.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                ExitCode::from(2)
            }
        },
        Command::Plugin(PluginCommand::New {
            name,
            dir,
            sdk_path,
        }) => match floe::transform::tools::scaffold(&dir, &name, sdk_path.as_deref()) {
            Ok(root) => {
                println!(
                    "created {}: `cargo test` runs its tests, `cargo build --release --target wasm32-wasip2` builds it",
                    root.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Plugin(PluginCommand::Test {
            plugin,
            input,
            with,
            fuel,
            memory,
        }) => {
            floe::telemetry::init_logging();
            let limits = floe::transform::Limits {
                fuel,
                memory,
                ..Default::default()
            };
            match floe::transform::tools::test_plugin(
                &plugin,
                &with,
                limits,
                &input,
                &mut std::io::stdout(),
            ) {
                Ok(summary) if summary.errors == 0 => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(3),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { config } => {
            let config = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(2);
                }
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let lines = runtime.block_on(floe::check::check(&config));
            print!("{}", floe::check::render(&lines));
            if floe::check::all_passed(&lines) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Run { config } => {
            floe::telemetry::init_logging();
            let config = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(2);
                }
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            match runtime.block_on(floe::run(config, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received, stopping");
}
