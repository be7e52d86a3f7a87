#!/bin/bash
# pmbench (github blakecaldwell/pmbench, built from source) for DURATION seconds. pmbench
# runs for a fixed time, so its figure is its own access rate (all its threads together),
# not the wall time: the rate goes to stderr and, with the engine it ran under, to the file
# $REAL_PROGRAMS_LOG (for run.py); stdout gets only what is the same everywhere.
# Usage: pmbench.sh PMBENCH_BINARY DURATION PMBENCH_ARGS...
set -euo pipefail
bin=$1 duration=$2
shift 2
out_file=$(mktemp)
trap 'rm -f "$out_file"' EXIT
"$bin" "$@" "$duration" >"$out_file" &
pid=$!
# Half-way through, how well what is out compressed (both sides, see compression.sh).
sleep $((duration / 2))
bash "$(dirname "$0")/compression.sh" "$pid" || echo "pmbench.sh: could not read the compression ratio" >&2
wait "$pid"
out=$(cat "$out_file")
# One "[T] Benchmark done - took 20.001 sec for 1650000 page access" line per thread (-j):
# the rate is their sum, every thread's accesses over its own time.
rate=$(awk '/Benchmark done/ { sum += $9 / $6; n++ } END { if (n) printf "%.0f", sum; else exit 1 }' <<<"$out")
. "$(dirname "$0")/engine.sh"
engine=$(engine_name)
echo "pmbench $engine: $rate accesses/s" >&2
[ -z "${REAL_PROGRAMS_LOG:-}" ] || echo "$engine $rate" >>"$REAL_PROGRAMS_LOG"
echo "pmbench done"
