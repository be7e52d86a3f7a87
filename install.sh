#!/usr/bin/env bash
# Builds and installs uswap for a user, with no root and nothing else to set:
#
#   ./install.sh [PREFIX]          # PREFIX defaults to ~/.local
#   ./install.sh --uninstall [PREFIX]   # removes those five files again
#
#   PREFIX/bin/uswap                      the command
#   PREFIX/lib/uswap/libuswap_shim.so     what `uswap run` preloads (found from the command's
#                                         own place: ../lib/uswap/)
#   PREFIX/lib/uswap/libuswap_preload.so  the engine it loads in a process that needs a pager
#   PREFIX/lib/libuswap.so                the C library
#   PREFIX/include/uswap.h                its header
#
# PROFILE=dev installs a debug build (what the tests use); the default is release.
set -euo pipefail
uninstall=0
case "${1:-}" in
    -h | --help)
        sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --uninstall)
        uninstall=1
        shift
        ;;
    -*)
        echo "install.sh: unknown option $1 (give a PREFIX, --uninstall [PREFIX] or --help)" >&2
        exit 2
        ;;
esac
prefix="${1:-${PREFIX:-$HOME/.local}}"
# Relative to where it was run from, not to the checkout this script changes to.
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac
if [ "$uninstall" -eq 1 ]; then
    rm -f "$prefix/bin/uswap" "$prefix/lib/uswap/libuswap_preload.so" "$prefix/lib/uswap/libuswap_shim.so" \
        "$prefix/lib/libuswap.so" \
        "$prefix/include/uswap.h"
    rmdir "$prefix/lib/uswap" 2>/dev/null || true
    echo "removed uswap from $prefix"
    exit 0
fi
profile="${PROFILE:-release}"
cd "$(dirname "$0")"
cargo build --profile "$profile" -p uswap-cli -p uswap-preload -p uswap-shim -p uswap-capi
# Where cargo put the build ($CARGO_TARGET_DIR, a config's target-dir, or ./target).
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
case "$profile" in
    dev) out="${target_dir:-target}/debug" ;;
    *) out="${target_dir:-target}/$profile" ;;
esac
install -D -m 755 "$out/uswap" "$prefix/bin/uswap"
install -D -m 755 "$out/libuswap_preload.so" "$prefix/lib/uswap/libuswap_preload.so"
install -D -m 755 "$out/libuswap_shim.so" "$prefix/lib/uswap/libuswap_shim.so"
install -D -m 755 "$out/libuswap.so" "$prefix/lib/libuswap.so"
install -D -m 644 uswap-capi/include/uswap.h "$prefix/include/uswap.h"
echo "installed uswap in $prefix: $prefix/bin/uswap (add $prefix/bin to PATH if it is not there)"
