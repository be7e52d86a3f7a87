#!/bin/bash
# pmbench (github blakecaldwell/pmbench, built from source) for DURATION seconds. pmbench
# runs for a fixed time, so its figure is its own access rate (all its threads together),
# not the wall time: the rate goes to stderr and, with the engine it ran under, to the file
# $REAL_PROGRAMS_LOG (for run.py); stdout gets only what is the same everywhere.
# Usage: pmbench.sh PMBENCH_BINARY DURATION PMBENCH_ARGS...
set -euo pipefail
bin=$1 duration=$2
shift 2
out=$("$bin" "$@" "$duration")
# One "[T] Benchmark done - took 20.001 sec for 1650000 page access" line per thread (-j):
# the rate is their sum, every thread's accesses over its own time.
rate=$(awk '/Benchmark done/ { sum += $9 / $6; n++ } END { if (n) printf "%.0f", sum; else exit 1 }' <<<"$out")
if [ -n "${USWAP_FAULT_MODE:-}" ]; then engine=uswap-$USWAP_FAULT_MODE
elif grep -q zram /proc/swaps; then engine=kernel-zram
else engine=kernel-file
fi
echo "pmbench $engine: $rate accesses/s" >&2
[ -z "${REAL_PROGRAMS_LOG:-}" ] || echo "$engine $rate" >>"$REAL_PROGRAMS_LOG"
echo "pmbench done"
