#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine:
# starts a local Kafka broker (Tansu, 127.0.0.1:19092), produces examples/data/events.ndjson,
# runs `floe run --config examples/local.toml` until everything is committed, stops it,
# and prints what PyIceberg and DuckDB read from the table. State lives in .floe/ (reset each run).
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
port="${FLOE_DEMO_PORT:-19092}"
export FLOE_BROKER="127.0.0.1:$port"

echo "== setup (Python tools, broker binary)"
bash scripts/setup.sh
source scripts/env.sh
profile="${FLOE_PROFILE:-debug}"   # FLOE_PROFILE=release for a optimised build (slower to compile)
echo "== build floe ($profile)"
if [[ "$profile" == release ]]; then cargo build --locked --release -p floe-agent --bin floe; else cargo build --locked -p floe-agent --bin floe; fi
floe="$CARGO_TARGET_DIR/$profile/floe"

rm -rf .floe && mkdir -p .floe
floe_pid=""
stop_all() {
    if [[ -n "$floe_pid" ]]; then kill "$floe_pid" 2>/dev/null || true; wait "$floe_pid" 2>/dev/null || true; fi
    bash scripts/broker.sh stop .floe/broker >/dev/null 2>&1 || true
}
trap stop_all EXIT

echo "== start broker on $FLOE_BROKER"
bash scripts/broker.sh start "$port" .floe/broker
"$FLOE_PYTHON" scripts/produce.py --bootstrap "$FLOE_BROKER" --topic events --partitions 4 --file examples/data/events.ndjson --key-field user
good=$(grep -c '^{.*}$' examples/data/events.ndjson || true)

echo "== floe run --config examples/local.toml (log: .floe/floe.log)"
"$floe" run --config examples/local.toml 2> .floe/floe.log &
floe_pid=$!
for _ in $(seq 1 120); do
    rows=$( (grep -o 'rows=[0-9]*' .floe/floe.log || true) | awk -F= '{s+=$2} END {print s+0}' || true)
    [[ "${rows:-0}" -ge "$good" ]] && break
    kill -0 "$floe_pid" 2>/dev/null || { cat .floe/floe.log; echo "floe stopped early" >&2; exit 1; }
    sleep 1
done
kill -TERM "$floe_pid"; wait "$floe_pid" || true; floe_pid=""
grep -E "committed|dead|ERROR|WARN" .floe/floe.log | sed 's/^/  /' | tail -5

echo "== what the readers see"
"$FLOE_PYTHON" scripts/show_table.py --catalog-db .floe/catalog.db --catalog-name local --warehouse .floe/warehouse --table demo.events
echo "dead letters: $(wc -l < .floe/dead-letter/events.ndjson) in .floe/dead-letter/events.ndjson"
