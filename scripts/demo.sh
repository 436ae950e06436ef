#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine:
# installs what the demo needs (a cached Python venv: broker, PyIceberg, DuckDB; not the
# REST-catalog server the tests use), builds floe, starts a local Kafka broker (Tansu,
# 127.0.0.1:19092), produces examples/data/events.ndjson, runs
# `floe run --config examples/local.toml` until everything is committed, shows
# `floe top --once`, stops it, and prints what PyIceberg and DuckDB read from the table.
# State lives in .floe/ (reset each run). Ends with how long each step took.
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
export FLOE_SETUP_MODE=demo
port="${FLOE_DEMO_PORT:-19092}"
export FLOE_BROKER="127.0.0.1:$port"
metrics="127.0.0.1:9464"   # [metrics] listen of examples/local.toml

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }'; }
t_start=$(now)

echo "== setup (Python venv: broker, PyIceberg, DuckDB)"
t=$(now)
bash scripts/setup.sh --demo
source scripts/env.sh
t_setup=$(since "$t")

profile="${FLOE_PROFILE:-debug}"   # FLOE_PROFILE=release for an optimised build (slower to compile)
echo "== build floe ($profile)"
t=$(now)
if [[ "$profile" == release ]]; then cargo build --locked --release -p floe-agent --bin floe; else cargo build --locked -p floe-agent --bin floe; fi
floe="$CARGO_TARGET_DIR/$profile/floe"
t_build=$(since "$t")

rm -rf .floe && mkdir -p .floe
floe_pid=""
stop_all() {
    if [[ -n "$floe_pid" ]]; then kill "$floe_pid" 2>/dev/null || true; wait "$floe_pid" 2>/dev/null || true; fi
    bash scripts/broker.sh stop .floe/broker >/dev/null 2>&1 || true
}
trap stop_all EXIT

echo "== start broker on $FLOE_BROKER"
t=$(now)
bash scripts/broker.sh start "$port" .floe/broker
"$FLOE_PYTHON" scripts/produce.py --bootstrap "$FLOE_BROKER" --topic events --partitions 4 --file examples/data/events.ndjson --key-field user
good=$(grep -c '^{.*}$' examples/data/events.ndjson || true)
t_broker=$(since "$t")

echo "== floe run --config examples/local.toml (log: .floe/floe.log)"
t=$(now)
# stderr is a file here: plain log lines (no colours, no progress lines), so `rows_written=` matches.
"$floe" run --config examples/local.toml 2> .floe/floe.log &
floe_pid=$!
rows=0
for _ in $(seq 1 240); do
    rows=$( (grep -o ' rows_written=[0-9]*' .floe/floe.log || true) | awk -F= '{s+=$2} END {print s+0}')
    [[ "$rows" -ge "$good" ]] && break
    kill -0 "$floe_pid" 2>/dev/null || { cat .floe/floe.log; echo "floe stopped early" >&2; exit 1; }
    sleep 0.5
done
[[ "$rows" -ge "$good" ]] || { tail -20 .floe/floe.log; echo "floe committed $rows of $good rows in 120 s" >&2; exit 1; }
t_run=$(since "$t")
t_first_table=$(since "$t_start")

echo "== floe top --once --metrics $metrics"
"$floe" top --once --metrics "$metrics" --width 110 || true

kill -TERM "$floe_pid"; wait "$floe_pid" || true; floe_pid=""
grep -E "committed|dead|ERROR|WARN" .floe/floe.log | sed 's/^/  /' | tail -5

echo "== what the readers see"
"$FLOE_PYTHON" scripts/show_table.py --catalog-db .floe/catalog.db --catalog-name local --warehouse .floe/warehouse --table demo.events
echo "dead letters: $(wc -l < .floe/dead-letter/events.ndjson) in .floe/dead-letter/events.ndjson"
echo "== time to the first table: ${t_first_table}s (setup ${t_setup}s, build ${t_build}s, broker + produce ${t_broker}s, floe until all $good rows committed ${t_run}s); whole demo $(since "$t_start")s"
