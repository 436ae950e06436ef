#!/usr/bin/env bash
# The agent over time (not part of the test run): `floe-soak` produces JSON records at a
# fixed rate into an in-process mock Kafka cluster, runs `floe run` (one passthrough
# plugin, scheduled maintenance) and samples its RSS, file descriptors, CPU and lag every
# minute, then prints the RSS slope. Builds floe and the soak driver in release.
#   scripts/soak.sh                     # 10 minutes at 150,000 records/s
#   scripts/soak.sh --minutes 120       # the full soak
#   scripts/soak.sh [--rate N] [--partitions N] [--sample SECONDS] [--commit-interval 60s]
#                   [--no-plugin] [--out FILE] [--work-dir DIR]
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
export FLOE_PLUGIN_DIR="${FLOE_PLUGIN_DIR:-$FLOE_CACHE/plugins}"

bash scripts/build-plugins.sh
cargo build --locked --release -p floe-agent --bin floe -p floe-tests --bin floe-soak
export FLOE_BIN="${FLOE_BIN:-$CARGO_TARGET_DIR/release/floe}"
exec "$CARGO_TARGET_DIR/release/floe-soak" "$@"
