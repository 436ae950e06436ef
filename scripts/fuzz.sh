#!/usr/bin/env bash
# Fuzzes each target in fuzz/ (cargo-fuzz, libFuzzer) for a set time; not part of CI,
# which replays the stored corpus (tests/fuzz_corpus.rs). New inputs that grow
# coverage are kept in fuzz/corpus/<target> (minimized at the end); a crash leaves its
# input in fuzz/artifacts/<target> and fails the run. Prints executions and crashes per
# target and writes them to .floe/fuzz-report.txt.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET (default 300)] [TARGET...]
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-300}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(json_admission avro_decode registry_response rest_response config_load)
fi
export FLOE_CACHE="${FLOE_CACHE:-/var/cache/floe}"
# Instrumented builds get their own target directory: sharing the main one would make
# every normal build start over.
export CARGO_TARGET_DIR="$FLOE_CACHE/fuzz-target"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
mkdir -p .floe
report="$root/.floe/fuzz-report.txt"
: > "$report"
status=0
cd fuzz
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="$root/.floe/fuzz-$t.log"
    # No sanitizer: the pinned stable toolchain has none; coverage guidance works.
    if cargo fuzz run --sanitizer none -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=4096 -timeout=20 \
        -print_final_stats=1 >"$log" 2>&1; then
        crashes=0
    else
        crashes=$(find "artifacts/$t" -type f | wc -l)
        [[ $crashes -eq 0 ]] && crashes="run failed (see $log)"
        status=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    # Keep the corpus small: only inputs that add coverage.
    mkdir -p "corpus/$t.min"
    cargo fuzz cmin --sanitizer none -O "$t" "corpus/$t" >/dev/null 2>&1 || true
    rm -rf "corpus/$t.min"
    files=$(find "corpus/$t" -type f | wc -l)
    line="$t: ${seconds}s, ${execs:-?} executions, crashes: $crashes, corpus: $files files"
    echo "$line" | tee -a "$report"
done
exit $status
