#!/usr/bin/env bash
# Regenerates uswap-capi/include/uswap.h from the Rust source with cbindgen (the version in
# Cargo.lock, configured by uswap-capi/cbindgen.toml). Run it after changing the C API and
# commit the header; `cargo test -p uswap-capi --test header` fails until then.
set -euo pipefail
cd "$(dirname "$0")/.."
USWAP_REGENERATE_HEADER=1 cargo test -p uswap-capi --test header header_is_current -- --exact
