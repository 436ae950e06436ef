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
