#!/usr/bin/env bash
# The full scale-out scenario (not part of the test run): three agents on one table
# while one is killed, one stopped and one started, with 200,000 records (CI runs the
# same test with 24,000), then the steady-state and zombie tests.
#   scripts/scale.sh [RECORDS]
set -euo pipefail
root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
bash scripts/setup.sh --tests >/dev/null
# shellcheck source=scripts/env.sh
source scripts/env.sh
cargo build --locked -p floe-agent --bin floe
export FLOE_BIN="$CARGO_TARGET_DIR/debug/floe"
export FLOE_SCALE_RECORDS="${1:-200000}"
exec cargo test --locked -p floe-tests --test scale -- --nocapture --test-threads 1
