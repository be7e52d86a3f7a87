#!/usr/bin/env bash
# Builds the uswap Python package into a virtual environment and runs its tests.
#
#   uswap-py/test.sh [pytest arguments]
#
# The environment is target/py-venv (reused between runs; remove it to start afresh): pip
# installs maturin, pytest and numpy from the package index, then the package itself from
# this directory, which maturin builds for this machine's python3. Needs python3 with venv,
# Rust and a C compiler, and permission to open a userfaultfd (root in CI). Every step runs
# under a timeout, and a test running over faulthandler_timeout (pyproject.toml) dumps the
# stacks of every thread before the run is ended.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/py-venv"
python="${PYTHON:-python3}"

step() {
    local limit_s="$1" what="$2"
    shift 2
    local rc=0
    timeout --kill-after=10 "$limit_s" "$@" || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "uswap-py/test.sh: $what did not finish within ${limit_s}s" >&2
    fi
    if [ "$rc" -ne 0 ]; then
        echo "uswap-py/test.sh: $what failed (status $rc)" >&2
        exit "$rc"
    fi
}

if [ ! -x "$venv/bin/python" ]; then
    step 120 "creating the virtual environment ($venv)" "$python" -m venv "$venv"
fi
step 600 "installing maturin, pytest and numpy" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.9.4,<2" pytest numpy
# A debug build (quick to build here; the engine's profile overrides keep it fast) in the
# workspace's target directory, so a rerun rebuilds only what changed.
step 900 "building and installing the package" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    --config-settings=build-args=--profile=dev "$here"
cd "$here"
step 600 "the pytest suite" "$venv/bin/python" -m pytest -q -rs "$@"
