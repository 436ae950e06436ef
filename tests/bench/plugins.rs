//! `floe-plugin-bench`: what plugins cost per record through the transform chain,
//! in-process (no broker, no table: only the chain the pipeline calls), and how long a
//! component takes to load cold and from the compilation cache.
//!
//! Records are shaped like the end-to-end bench's (about 134 bytes of JSON). Each
//! scenario runs every record through `TransformChain::run` in calls of `--batch`
//! records, `--rounds` times; the best round counts. Run in release:
//!
//! ```sh
//! FLOE_PLUGIN_DIR=/var/cache/floe/plugins bash scripts/build-plugins.sh
//! FLOE_PLUGIN_DIR=/var/cache/floe/plugins cargo run --release -p floe-tests --bin floe-plugin-bench
//! ```

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use floe::record::json::{JsonObject, PatchRef};
use floe::transform::{
    ChainInput, Limits, OnError, PluginsConfig, TransformChain, TransformConfig, TransformEngine,
};
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// Records per round.
    #[arg(long, default_value_t = 200_000)]
    records: usize,
    /// Records per call to the chain (the pipeline's batch).
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Rounds per scenario (the best one counts).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only the scenarios whose name contains this, and no load times (for profiling
    /// one with `FLOE_WASM_PERFMAP=1 perf record`).
    #[arg(long)]
    only: Option<String>,
    /// Count fuel (`limits.fuel` set on every plugin), to see what it costs; also prints
    /// the fuel used per record (about one unit per WebAssembly instruction: a measure
    /// of the plugins' own work that does not move with the machine's load).
    #[arg(long)]
    fuel: bool,
}

fn record(i: usize) -> Value {
    const EVENTS: [&str; 5] = ["page_view", "click", "signup", "purchase", "logout"];
    json!({
        "id": i,
        "user": format!("user-{}@example.com", (i * 7919) % 100_000),
        "event": EVENTS[i % 5],
        "amount": (i % 10_000) as f64 / 100.0,
        "ts": format!("2024-01-01T{:02}:{:02}:{:02}.{:06}Z", (i / 3600) % 24, (i / 60) % 60, i % 60, i % 1_000_000),
        "tags": ["beta", "web"],
    })
}

const FILTER: (&str, &str) = (
    "filter",
    r#"all = [{ field = "event", op = "in", value = ["page_view", "click", "purchase"] }]"#,
);
const REDACT: (&str, &str) = (
    "redact",
    r#"drop = ["tags"]
hash = ["user"]
salt = "pepper""#,
);
const DROP: (&str, &str) = ("redact", r#"drop = ["tags"]"#);
const RENAME: (&str, &str) = (
    "rename",
    r#"fields = { ts = "event_time", amount = "amount_eur" }"#,
);
const PASS: (&str, &str) = ("passthrough", "");

fn config(plugin: &str, with: &str, fuel: bool) -> Result<TransformConfig> {
    Ok(TransformConfig {
        uses: floe_tests::plugin_path(plugin).display().to_string(),
        name: None,
        with: toml::Value::Table(toml::from_str(with)?).into(),
        limits: Limits {
            fuel: fuel.then_some(10_000_000_000),
            ..Limits::default()
        },
        on_error: OnError::DeadLetter,
        allow_clock: false,
        allow_random: false,
    })
}

fn engine(cache: &std::path::Path, fuel: bool) -> Result<TransformEngine> {
    Ok(TransformEngine::counting_fuel(
        &PluginsConfig {
            path: vec![],
            cache_dir: cache.to_path_buf(),
        },
        8,
        64 << 20,
        fuel,
    )?)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let values: Vec<JsonObject> = (0..args.records)
        .map(|i| JsonObject::parse(record(i).to_string().into_bytes()))
        .collect::<Result<_, _>>()?;
    let bytes: usize = values.iter().map(|v| v.as_bytes().len()).sum();
    let inputs: Vec<ChainInput<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, value)| ChainInput {
            value: value.view(),
            topic: "events",
            partition: (i % 8) as i32,
            offset: i as i64,
            timestamp_ms: Some(1_700_000_000_000 + i as i64),
            key: None,
        })
        .collect();
    println!(
        "{} records of {:.0} bytes on average, calls of {} records, best of {} rounds",
        args.records,
        bytes as f64 / args.records as f64,
        args.batch,
        args.rounds
    );

    println!("\nthe agent's own JSON work per record (record::json), for comparison");
    let t = Instant::now();
    for v in &values {
        std::hint::black_box(JsonObject::parse(v.as_bytes().to_vec())?);
    }
    let parse = t.elapsed().as_nanos() as f64 / values.len() as f64;
    // Borrowed ops, as the agent applies a plugin's answer.
    let hashed = format!("\"{}\"", "0123456789abcdef".repeat(4));
    let set = [PatchRef::Set {
        path: &["user"],
        value: hashed.as_bytes(),
    }];
    let remove = [PatchRef::Remove { path: &["tags"] }];
    let t = Instant::now();
    for v in &values {
        std::hint::black_box(v.view().apply_borrowed(&set)?);
    }
    let set_ns = t.elapsed().as_nanos() as f64 / values.len() as f64;
    let t = Instant::now();
    for v in &values {
        std::hint::black_box(v.view().apply_borrowed(&remove)?);
    }
    let remove_ns = t.elapsed().as_nanos() as f64 / values.len() as f64;
    let both = [set[0], remove[0]];
    let t = Instant::now();
    for v in &values {
        std::hint::black_box(v.view().apply_borrowed(&both)?);
    }
    let both_ns = t.elapsed().as_nanos() as f64 / values.len() as f64;
    let renames = [
        PatchRef::Rename {
            path: &["ts"],
            to: "event_time",
        },
        PatchRef::Rename {
            path: &["amount"],
            to: "amount_eur",
        },
    ];
    let t = Instant::now();
    for v in &values {
        std::hint::black_box(v.view().apply_borrowed(&renames)?);
    }
    let renames_ns = t.elapsed().as_nanos() as f64 / values.len() as f64;
    println!(
        "parse {parse:.0} ns, apply one set {set_ns:.0} ns, one remove {remove_ns:.0} ns, \
         a set and a remove in one pass {both_ns:.0} ns, two renames {renames_ns:.0} ns"
    );

    println!(
        "\nload time per plugin (compile, or load from the cache; then a chain: load from the cache, instantiate, init)"
    );
    println!(
        "{:<14} {:>10} {:>12} {:>10}",
        "plugin", "cold ms", "cached ms", "chain ms"
    );
    let measure_loads = if args.only.is_some() {
        &[][..]
    } else {
        &[PASS, FILTER, REDACT, RENAME][..]
    };
    for &(plugin, with) in measure_loads {
        let cache = tempfile::tempdir()?;
        let c = config(plugin, with, args.fuel)?;
        let cold = {
            let e = engine(cache.path(), args.fuel)?;
            let t = Instant::now();
            e.load(&c)?;
            t.elapsed()
        };
        let e = engine(cache.path(), args.fuel)?;
        let t = Instant::now();
        e.load(&c)?;
        let cached = t.elapsed();
        let t = Instant::now();
        TransformChain::new("bench", &e, std::slice::from_ref(&c))?;
        let chain = t.elapsed();
        println!(
            "{plugin:<14} {:>10.1} {:>12.2} {:>10.2}",
            ms(cold),
            ms(cached),
            ms(chain)
        );
    }

    let cache = tempfile::tempdir()?;
    let e = engine(cache.path(), args.fuel)?;
    let scenarios: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no plugin", vec![]),
        ("passthrough", vec![PASS]),
        ("passthrough, in a runtime", vec![PASS]),
        ("filter (keeps 60 %)", vec![FILTER]),
        ("redact, drop only (patch)", vec![DROP]),
        ("redact, drop + hash (patch)", vec![REDACT]),
        ("rename (patch)", vec![RENAME]),
        ("3 x passthrough", vec![PASS, PASS, PASS]),
        ("filter + redact + rename", vec![FILTER, REDACT, RENAME]),
        (
            "filter + redact + rename, 2 threads",
            vec![FILTER, REDACT, RENAME],
        ),
    ];
    println!("\ncost through TransformChain::run (encode, call, decode, apply), per input record");
    println!(
        "{:<36} {:>12} {:>12} {:>12} {:>12}",
        "scenario",
        "ns/record",
        "records/s",
        "out/in",
        if args.fuel { "fuel/record" } else { "" }
    );
    for (name, plugins) in scenarios {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let configs = plugins
            .iter()
            .map(|(p, w)| config(p, w, args.fuel))
            .collect::<Result<Vec<_>>>()?;
        let lanes = if name.contains("2 threads") { 2 } else { 1 };
        let mut chain = if configs.is_empty() {
            TransformChain::empty()
        } else {
            TransformChain::with_lanes("bench", &e, &configs, lanes)?
        };
        // Called from inside a tokio runtime (the pipeline's intake runs on a blocking
        // thread of the runtime), the chain hops to a thread of its own for each call.
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let _inside = name.contains("in a runtime").then(|| runtime.enter());
        let mut best = Duration::MAX;
        let mut out = 0;
        let fuel_before = chain.fuel_used();
        for round in 0..=args.rounds {
            let t = Instant::now();
            out = 0;
            for chunk in inputs.chunks(args.batch) {
                let result = chain.run(chunk)?;
                assert!(result.errors.is_empty(), "{:?}", result.errors.first());
                out += result.outputs.len();
            }
            // Round 0 warms up.
            if round > 0 {
                best = best.min(t.elapsed());
            }
        }
        let ns = best.as_nanos() as f64 / args.records as f64;
        // Every round (the warm-up too) ran every record once.
        let runs = ((args.rounds + 1) * args.records) as f64;
        let fuel = (chain.fuel_used() - fuel_before) as f64 / runs;
        println!(
            "{name:<36} {ns:>12.0} {:>12.0} {:>12.2} {:>12}",
            1e9 / ns,
            out as f64 / args.records as f64,
            if args.fuel {
                format!("{fuel:.0}")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
