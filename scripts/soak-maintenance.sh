#!/usr/bin/env bash
# The maintenance-while-ingesting test for longer than CI runs it: two pipelines commit
# every second while scheduled maintenance and `floe maintain` processes compact and
# expire their tables; then nothing may be lost or duplicated.
#   scripts/soak-maintenance.sh [SECONDS]   (default 60; CI runs 20)
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
bash scripts/setup.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh
cargo build --locked -p floe-agent --bin floe
export FLOE_BIN="$CARGO_TARGET_DIR/debug/floe"
export FLOE_PLUGIN_DIR="$FLOE_CACHE/plugins"
export FLOE_SOAK_SECONDS="${1:-60}"
exec cargo test --locked -p floe-tests --test maintenance -- maintenance_runs_while_pipelines_commit --nocapture
