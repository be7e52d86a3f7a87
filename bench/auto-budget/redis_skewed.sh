#!/bin/sh
# redis-server with 100k values of 4 KiB (about 430 MiB), then for SECONDS (default 90)
# redis-benchmark GETs over the first 10k keys only: a hot tenth, the rest never read again.
# Prints the GET rate (the figure a limit slows) and the key count.
# Usage: redis_skewed.sh [SECONDS] [mixed|repeated]
# Values: `mixed` (the default), half random hex and half English words, different for every
# key (../real-programs/cache_values.py: lz4 gets 1.2-1.3x, as from a real cache's values);
# `repeated`, a key's 12-digit number repeated (the first sittings' values: they compress to
# almost nothing, and so measured the fault path more than the store).
# The loader and the benchmark run without uswap's preload (env -u LD_PRELOAD): under
# `uswap run` they would each be a process with a pager of its own, a new one every 100k
# requests, whose start-up would be counted as the server's slowdown; they stay in the
# kernel's cgroup on the other side, where they cost nothing extra.
set -eu
seconds=${1:-90}
values=${2:-mixed}
keys=100000
case $values in
mixed | repeated) ;;
*) echo "values are mixed or repeated, not $values" >&2; exit 2 ;;
esac
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
if [ "$values" = mixed ]; then
    env -u LD_PRELOAD /usr/bin/python3 "$(dirname "$0")/../real-programs/cache_values.py" "$keys" 4096 |
        env -u LD_PRELOAD redis-cli -p "$port" --pipe >/dev/null
else
    env -u LD_PRELOAD /usr/bin/python3 - "$keys" <<'PY' | env -u LD_PRELOAD redis-cli -p "$port" --pipe >/dev/null
import sys
n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    k = "key:%012d" % i
    v = ("%012d" % i) * 342  # 4104 bytes, different for every key
    out.write("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
PY
fi
start=$(date +%s)
requests=0
while [ $(( $(date +%s) - start )) -lt "$seconds" ]; do
    env -u LD_PRELOAD redis-benchmark -p "$port" -t get -n 100000 -r 10000 -q >/dev/null 2>&1
    requests=$((requests + 100000))
done
elapsed=$(( $(date +%s) - start ))
echo "GETs $requests in ${elapsed}s: $((requests / elapsed))/s"
redis-cli -p "$port" dbsize
