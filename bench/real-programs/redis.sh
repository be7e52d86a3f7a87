#!/bin/sh
# redis-server loaded with about 600 MiB of values, then random GETs from redis-benchmark.
# Prints only what must be the same under every engine (the key count); the request rate
# goes to stderr. Usage: redis.sh [KEYS] [GETS]
set -eu
keys=${1:-150000}
gets=${2:-200000}
dir=$(mktemp -d)
# A port the kernel says is free now (one derived from the PID could be a client's
# ephemeral port: a server that cannot bind exits, and the script said only that it did not
# start).
port=$(env -u LD_PRELOAD /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --save "" --appendonly no --dir "$dir" --logfile "$dir/log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "redis-server did not start; its log:" >&2; cat "$dir/log" >&2; exit 1; }
    sleep 0.1
done
# Every key 0..keys-1 once (sequential __rand_int__ is not available: write them with a
# pipeline of SETs), 4 KiB values.
python3 - "$keys" <<'PY' | redis-cli -p "$port" --pipe >/dev/null
import sys
n = int(sys.argv[1])
v = "x" * 4096
out = sys.stdout
for i in range(n):
    k = "key:%012d" % i
    out.write("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
PY
redis-benchmark -p "$port" -t get -n "$gets" -r "$keys" -d 4096 -q 2>/dev/null | tr '\r' '\n' | grep "GET:" | tail -1 >&2
redis-cli -p "$port" dbsize
