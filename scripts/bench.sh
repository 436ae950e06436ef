#!/usr/bin/env bash
# Benchmarks (not part of the test run): builds Floe and the bench in release, installs
# the tools, builds the plugins, then runs tests/bench (a local broker, 1M JSON records of
# about 134 bytes by default) and prints a table; results also go to bench-results.json.
#   scripts/bench.sh [--records N] [--partitions N] [--out FILE] [--skip-peer]
#                    [--rounds N] [--only-maintenance | --skip-maintenance]
#                    [--maintenance-commits N]
# --rounds N (default 3) runs the `floe` scenarios (c) and (d) N times in turn; each
# plugin ratio to (c) is the median of the rounds' own ratios (all of them are printed).
# --only-maintenance runs scenario (f) alone: 1,000 upsert commits over 10k keys with
# table maintenance off and on (file count, metadata bytes, commit latency, scan time).
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"

bash scripts/setup.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh
export FLOE_PLUGIN_DIR="$FLOE_CACHE/plugins"
bash scripts/build-plugins.sh >/dev/null
cargo build --locked --release -p floe-agent --bin floe -p floe-tests --bin floe-bench
export FLOE_BIN="$CARGO_TARGET_DIR/release/floe"
exec "$CARGO_TARGET_DIR/release/floe-bench" "$@"
