#!/usr/bin/env bash
# Builds and installs uswap for a user, with no root and nothing else to set:
#
#   ./install.sh [PREFIX]          # PREFIX defaults to ~/.local
#
#   PREFIX/bin/uswap                      the command
#   PREFIX/lib/uswap/libuswap_preload.so  what `uswap run` preloads (found from the command's
#                                         own place: ../lib/uswap/)
#   PREFIX/lib/libuswap.so                the C library
#   PREFIX/include/uswap.h                its header
#
# PROFILE=dev installs a debug build (what the tests use); the default is release.
set -euo pipefail
prefix="${1:-${PREFIX:-$HOME/.local}}"
profile="${PROFILE:-release}"
cd "$(dirname "$0")"
cargo build --profile "$profile" -p uswap-cli -p uswap-preload -p uswap-capi
# Where cargo put the build ($CARGO_TARGET_DIR, a config's target-dir, or ./target).
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
case "$profile" in
    dev) out="${target_dir:-target}/debug" ;;
    *) out="${target_dir:-target}/$profile" ;;
esac
install -D -m 755 "$out/uswap" "$prefix/bin/uswap"
install -D -m 755 "$out/libuswap_preload.so" "$prefix/lib/uswap/libuswap_preload.so"
install -D -m 755 "$out/libuswap.so" "$prefix/lib/libuswap.so"
install -D -m 644 uswap-capi/include/uswap.h "$prefix/include/uswap.h"
echo "installed uswap in $prefix: $prefix/bin/uswap (add $prefix/bin to PATH if it is not there)"
