#!/usr/bin/env bash
# Builds every WebAssembly plugin of the repo (plugins/*/ and the test plugins in
# tests/plugins/*/) as wasm32-wasip2 components with the `plugin` profile, in one cargo
# invocation, and copies them to the plugin directory:
#   plugins/<name>       (package floe-plugin-<name>)      -> $FLOE_PLUGIN_DIR/<name>.wasm
#   tests/plugins/<name> (package floe-test-plugin-<name>) -> $FLOE_PLUGIN_DIR/test-<name>.wasm
#
# Environment:
#   FLOE_CACHE       cache root (default /var/cache/floe); cargo builds into $FLOE_CACHE/target-wasm
#   FLOE_PLUGIN_DIR  where the .wasm files go (default plugins/dist, the agent's default
#                    [plugins] path; the tests set it to $FLOE_CACHE/plugins)
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
# From the root, rustup and cargo follow the repo's rust-toolchain.toml.
cd "$root"

cache="${FLOE_CACHE:-/var/cache/floe}"
export CARGO_TARGET_DIR="$cache/target-wasm"
out_dir="${FLOE_PLUGIN_DIR:-$root/plugins/dist}"
target=wasm32-wasip2
profile=plugin

if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx "$target"; then
        rustup target add "$target"
    fi
fi

# The `name = "..."` of a manifest's [package] section.
package_name() {
    awk '
        /^[[:space:]]*\[/ { in_package = ($0 ~ /^[[:space:]]*\[package\][[:space:]]*$/); next }
        in_package && /^[[:space:]]*name[[:space:]]*=/ {
            sub(/^[^=]*=[[:space:]]*"/, ""); sub(/".*$/, ""); print; exit
        }
    ' "$1"
}

packages=()   # cargo package names
artifacts=()  # file names cargo writes
outputs=()    # file names in $out_dir
shopt -s nullglob
for manifest in plugins/*/Cargo.toml tests/plugins/*/Cargo.toml; do
    name="$(package_name "$manifest")"
    if [[ -z "$name" ]]; then
        echo "build-plugins: no package name in $manifest" >&2
        exit 1
    fi
    case "$manifest" in
        tests/*) prefix=floe-test-plugin- out_prefix=test- ;;
        *) prefix=floe-plugin- out_prefix= ;;
    esac
    if [[ "$name" != "$prefix"* ]]; then
        echo "build-plugins: package $name in $manifest should be named $prefix<name>" >&2
        exit 1
    fi
    packages+=("$name")
    artifacts+=("${name//-/_}.wasm")
    short="${name#"$prefix"}"
    outputs+=("$out_prefix${short//-/_}.wasm")
done
shopt -u nullglob

if ((${#packages[@]} == 0)); then
    echo "build-plugins: no plugins found under plugins/ or tests/plugins/" >&2
    exit 1
fi

args=()
for p in "${packages[@]}"; do args+=(-p "$p"); done
cargo build --locked --target "$target" --profile "$profile" "${args[@]}"

mkdir -p "$out_dir"
for i in "${!packages[@]}"; do
    src="$CARGO_TARGET_DIR/$target/$profile/${artifacts[$i]}"
    dst="$out_dir/${outputs[$i]}"
    if [[ ! -f "$src" ]]; then
        echo "build-plugins: cargo did not produce $src (is crate-type cdylib?)" >&2
        exit 1
    fi
    # Copy then rename, so a reader never sees a half-written file.
    cp -- "$src" "$dst.tmp.$$"
    mv -f -- "$dst.tmp.$$" "$dst"
    size=$(wc -c <"$dst")
    printf '%-32s %9d bytes (%d KiB)  %s\n' "${outputs[$i]}" "$size" $(((size + 1023) / 1024)) "$dst"
done

# Core-module builds of passthrough: the agent turns them into components at load time
# (wasm32-wasip1 through the preview 1 adapter). Used by the tests of that path.
for core_target in wasm32-wasip1 wasm32-unknown-unknown; do
    if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$core_target"; then
        rustup target add "$core_target"
    fi
    cargo build --locked --target "$core_target" --profile "$profile" -p floe-plugin-passthrough
    dst="$out_dir/passthrough-${core_target#wasm32-}.wasm"
    cp -- "$CARGO_TARGET_DIR/$core_target/$profile/floe_plugin_passthrough.wasm" "$dst.tmp.$$"
    mv -f -- "$dst.tmp.$$" "$dst"
    printf '%-32s %9d bytes  %s\n' "${dst##*/}" "$(wc -c <"$dst")" "$dst"
done
