#!/usr/bin/env bash
# Runs every check and test of Floe on a fresh machine of this kind:
# installs the test tools (cached venv: Tansu broker, PyIceberg, DuckDB), builds,
# then fmt, clippy, unit tests and the integration tests against real services.
# Every service a test needs is started by the test itself on 127.0.0.1 and stopped
# afterwards; anything left behind by a crashed test is killed on exit.
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FLOE_CACHE/target}"
# Incremental compilation state is tens of GB for this workspace; CI builds once.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Every process started below inherits this marker, so cleanup finds exactly ours.
export FLOE_TEST_RUN="floe-test-$$-$RANDOM"

cleanup() {
    local pid
    for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}"; pid="${pid%/environ}"
        [[ "$pid" == "$$" ]] && continue
        if { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qx "FLOE_TEST_RUN=$FLOE_TEST_RUN"; then
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT

step() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "setup"
# Test tools: the venv and the REST catalog server (built once, cached).
bash scripts/setup.sh --tests
# shellcheck source=scripts/env.sh
source scripts/env.sh

step "format"
cargo fmt --all -- --check

step "module cycles"
# No two modules of the agent or of floe-iceberg import each other outside tests.
python3 scripts/check-module-cycles.py agent/src
python3 scripts/check-module-cycles.py agent/iceberg/src

step "build"
cargo build --locked --workspace --all-targets
export FLOE_BIN="$CARGO_TARGET_DIR/debug/floe"

step "plugins (wasm32-wasip2)"
export FLOE_PLUGIN_DIR="$FLOE_CACHE/plugins"
bash scripts/build-plugins.sh

step "clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "tests"
cargo test --locked --workspace
