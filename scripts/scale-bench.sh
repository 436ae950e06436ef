#!/usr/bin/env bash
# Many tables in one agent (not part of the test run): for 1, 10, 100 and 500 topics
# (and 500 topics of which 10 receive records) starts a local Tansu broker, produces
# 400,000 JSON records of about 140 bytes spread over the topics, runs `floe run` with
# one topic_pattern pipeline writing a table per topic, and prints start-up seconds,
# records per second and per CPU-second, peak and idle RSS; results also go to
# scale-results.json. Builds the agent in release unless FLOE_BIN names one.
#   scripts/scale-bench.sh [--tables 1,10,100,500,500:10] [--active-topics K]
#                          [--records N] [--partitions N] [--commit-interval 5s]
#                          [--timeout SECONDS] [--list-topics] [--out FILE]
#                          [--work-dir DIR] [--keep]
# --tables N:K runs N topics of which only K receive records (mostly idle tables);
# --active-topics K does so for every entry without its own :K.
# --list-topics names every topic in the config instead of a topic_pattern.
# --timeout (default 600) bounds each scenario; --keep keeps its directory and logs.
#
# With --keys (scripts/keys_bench.py): upsert into tables of 1M, 10M and 100M live keys
# (seeded through PyIceberg), then 2,000,000 updates through the broker:
#   scripts/scale-bench.sh --keys 1000000,10000000,100000000 [--updates N]
#                          [--existing 0.1] [--commit-interval 10s] [--out FILE]
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"

# shellcheck source=scripts/env.sh
source scripts/env.sh
if [[ -z "${FLOE_BIN:-}" ]]; then
    cargo build --locked --release -p floe-agent --bin floe
    export FLOE_BIN="$CARGO_TARGET_DIR/release/floe"
fi
export FLOE_BIN
for arg in "$@"; do
    if [[ "$arg" == --keys || "$arg" == --keys=* ]]; then
        exec "$FLOE_PYTHON" scripts/keys_bench.py "$@"
    fi
done
exec "$FLOE_PYTHON" scripts/scale_bench.py "$@"
