#!/bin/bash
# redis-server loaded with KEYS values, then random GETs from redis-benchmark. Prints only
# what must be the same under every engine (the key count); the request rate goes to stderr
# and, with the engine it ran under, to the file $REAL_PROGRAMS_LOG (for run.py).
#
# Usage: redis.sh [KEYS] [GETS] [OPTION...]
#   --value-bytes N   each value's size (default 4096)
#   --pipeline P      requests per round trip of each client (redis-benchmark -P, default 1)
#   --clients C       parallel clients (redis-benchmark -c, default 50)
#   --io-threads T    the server's I/O threads (io-threads, default 1: none)
#
# The values are at least as hard to compress as what a cache holds (cache_values.py: half
# random hex, half English words, different for every key). With 1,000-byte values lz4 gets
# 1.2-1.3x out of the pages that go out (zram's mm_stat 1.27x, uswap's pool 1.22x).
set -euo pipefail
keys=${1:-150000}
gets=${2:-200000}
shift $(($# < 2 ? $# : 2))
value_bytes=4096 pipeline=1 clients=50 io_threads=1
while [ $# -gt 0 ]; do
    case $1 in
    --value-bytes) value_bytes=$2 ;;
    --pipeline) pipeline=$2 ;;
    --clients) clients=$2 ;;
    --io-threads) io_threads=$2 ;;
    *) echo "redis.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
dir=$(mktemp -d)
# A port the kernel says is free now (one derived from the PID could be a client's
# ephemeral port: a server that cannot bind exits, and the script said only that it did not
# start).
port=$(env -u LD_PRELOAD /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --save "" --appendonly no --dir "$dir" --logfile "$dir/log" \
    --io-threads "$io_threads" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "redis-server did not start; its log:" >&2; cat "$dir/log" >&2; exit 1; }
    sleep 0.1
done
# Every key 0..keys-1 once (sequential __rand_int__ is not available: write them with a
# pipeline of SETs), the values of cache_values.py.
python3 "$(dirname "$0")/cache_values.py" "$keys" "$value_bytes" | redis-cli -p "$port" --pipe >/dev/null
# How well the values that went out compressed (both sides, see compression.sh).
bash "$(dirname "$0")/compression.sh" "$server" || echo "redis.sh: could not read the compression ratio" >&2
line=$(redis-benchmark -p "$port" -t get -n "$gets" -r "$keys" -d "$value_bytes" -P "$pipeline" -c "$clients" -q \
    2>/dev/null | tr '\r' '\n' | grep "GET:" | tail -1)
echo "$line" >&2
# "GET: 81234.56 requests per second, p50=0.271 msec"
rate=$(awk '{ printf "%.0f", $2 }' <<<"$line")
. "$(dirname "$0")/engine.sh"
engine=$(engine_name)
[ -z "${REAL_PROGRAMS_LOG:-}" ] || echo "$engine $rate" >>"$REAL_PROGRAMS_LOG"
redis-cli -p "$port" dbsize
