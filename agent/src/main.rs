//! The `floe` command.

mod top;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use floe::config::{Config, ConfigErrors};
use floe::telemetry::LogFormat;

/// Floe: Kafka topics into Apache Iceberg tables, exactly once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log lines as text (colours only on a terminal) or as one JSON object per line.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "FLOE_LOG_FORMAT"
    )]
    log_format: LogFormatArg,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(f: LogFormatArg) -> LogFormat {
        match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run every pipeline of a config until SIGINT or SIGTERM. On a terminal, one
    /// progress line per pipeline stays below the log.
    Run {
        /// Config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// No progress lines, even on a terminal.
        #[arg(long)]
        no_progress: bool,
    },
    /// A live view of a running agent's pipelines and plugins, read from its metrics
    /// endpoint (`[metrics] listen`); `q` quits.
    Top {
        /// The agent's metrics endpoint: `HOST:PORT`, `http://HOST:PORT` or the full
        /// `/metrics` URL.
        #[arg(long, env = "FLOE_METRICS", default_value = "127.0.0.1:9464")]
        metrics: String,
        /// Time between scrapes (rates are computed over it).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Print one text rendering (two scrapes `--interval` apart) and exit.
        #[arg(long)]
        once: bool,
        /// Maximum width of the `--once` rendering (default: the terminal's, else 132).
        #[arg(long)]
        width: Option<u16>,
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
    /// Maintain the configured tables once: compact, expire snapshots, delete orphan
    /// and old metadata files; prints what each job did.
    Maintain {
        /// Config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Only this table (`name` or `namespace.name`).
        #[arg(long)]
        table: Option<String>,
        /// Report what would be done without changing anything.
        #[arg(long)]
        dry_run: bool,
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
        /// The floe-sdk crate to build against (the `sdk/` folder of a Floe checkout;
        /// found by itself when run inside one). floe-sdk is not on a registry yet.
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
        /// Fuel per batch (a deterministic bound; not counted unless given).
        #[arg(long)]
        fuel: Option<u64>,
        /// Memory limit in bytes.
        #[arg(long, default_value_t = 64 << 20)]
        memory: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = LogFormat::from(cli.log_format);
    match cli.command {
        Command::Validate { config } => match Config::load(&config) {
            Ok(c) => {
                let text = std::fs::read_to_string(&config).unwrap_or_default();
                for w in Config::placed(&text, c.warnings()) {
                    eprintln!("{}: warning: {w}", config.display());
                }
                let missing = Config::placed(&text, c.missing_files());
                if !missing.is_empty() {
                    eprintln!("{}: {}", config.display(), ConfigErrors(missing));
                    return ExitCode::from(2);
                }
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
        }) => {
            // No registry has floe-sdk yet: without --sdk-path, a Floe checkout around the
            // current directory lends its `sdk/`; otherwise the user is told what to pass.
            let sdk = sdk_path.or_else(floe::transform::tools::find_sdk);
            match floe::transform::tools::scaffold(&dir, &name, sdk.as_deref()) {
                Ok(root) => {
                    println!(
                        "created {}: `cargo test` runs its tests, `cargo build --release --target wasm32-wasip2` builds it",
                        root.display()
                    );
                    match sdk {
                        Some(sdk) => println!("floe-sdk from {}", sdk.display()),
                        None => eprintln!(
                            "note: floe-sdk {} is not on a package registry yet, so this crate builds only with the SDK from a Floe checkout: run `floe plugin new` again with --sdk-path <checkout>/sdk (or FLOE_SDK_PATH)",
                            floe::transform::tools::SDK_VERSION
                        ),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => failed(e),
            }
        }
        Command::Plugin(PluginCommand::Test {
            plugin,
            input,
            with,
            fuel,
            memory,
        }) => {
            init_plain_logging(log_format);
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
                Err(e) => failed(e),
            }
        }
        Command::Check { config } => {
            let (config, runtime) = match config_and_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            let lines = runtime.block_on(floe::check::check(&config));
            print!("{}", floe::check::render(&lines));
            if floe::check::all_passed(&lines) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Maintain {
            config,
            table,
            dry_run,
        } => {
            let (config, runtime) = match config_and_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(floe::maintain::maintain(&config, table.as_deref(), dry_run)) {
                Ok(reports) if reports.is_empty() => {
                    eprintln!(
                        "no table matches {}",
                        table.as_deref().unwrap_or("the config")
                    );
                    ExitCode::from(2)
                }
                Ok(reports) => {
                    print!("{}", floe::maintain::render(&reports, dry_run));
                    if floe::maintain::all_ok(&reports) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => failed(e),
            }
        }
        Command::Run {
            config,
            no_progress,
        } => {
            let progress = (!no_progress && std::io::stderr().is_terminal())
                .then(top::progress::StatusArea::default);
            match &progress {
                Some(area) => floe::telemetry::init_logging_to(log_format, true, area.clone()),
                None => init_plain_logging(log_format),
            }
            let (config, runtime) = match config_and_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            let progress_task = progress.as_ref().map(|area| {
                // Metrics are recorded from the start, whether or not [metrics] serves them.
                floe::telemetry::recorder();
                runtime.spawn(top::progress::run(area.clone(), Duration::from_secs(1)))
            });
            let result = runtime.block_on(floe::run(config, shutdown_signal()));
            if let (Some(task), Some(area)) = (progress_task, &progress) {
                task.abort();
                area.clear();
            }
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
        Command::Top {
            metrics,
            interval,
            once,
            width,
        } => top::run_command(&metrics, interval, once, width),
    }
}

/// Loads the config at `path` and builds the runtime the command runs on; a config
/// that does not load is reported, with exit code 2.
fn config_and_runtime(path: &Path) -> Result<(Config, tokio::runtime::Runtime), ExitCode> {
    let config = Config::load(path).map_err(|e| {
        eprintln!("{}: {e}", path.display());
        ExitCode::from(2)
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    Ok((config, runtime))
}

/// Reports a command's error; exit code 1.
fn failed(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// Logs to stderr, coloured only when stderr is a terminal.
fn init_plain_logging(format: LogFormat) {
    floe::telemetry::init_logging_to(format, std::io::stderr().is_terminal(), std::io::stderr);
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
