#!/bin/bash
# memcached (multi-threaded: its worker threads serve the connections) loaded with KEYS
# values, then GETS random GETs from CLIENTS client processes, each asking for PIPELINE
# keys per round trip (one multi-key `get`, memcached's pipelining). Prints only what must
# be the same under every engine (the keys loaded and the GETs answered); the request rate
# goes to stderr and, with the engine it ran under, to the file $REAL_PROGRAMS_LOG (for
# run.py), as redis.sh does.
#
# Usage: memcached.sh [KEYS] [GETS] [OPTION...]
#   --value-bytes N   each value's size (default 1000)
#   --threads T       memcached's worker threads (-t, default 4, memcached's own default)
#   --clients C       client processes, one connection each (default 4)
#   --pipeline P      keys per `get` (default 16)
#
# The values are redis.sh's, byte for byte (cache_values.py): half random hex and half
# English words, different for every key; lz4 gets 1.2-1.3x out of them. The GETs
# are uniform over the keys, from a seeded generator per client: every engine is asked the
# same keys in the same order.
set -euo pipefail
keys=${1:-500000}
gets=${2:-1000000}
shift $(($# < 2 ? $# : 2))
value_bytes=1000 threads=4 clients=4 pipeline=16
while [ $# -gt 0 ]; do
    case $1 in
    --value-bytes) value_bytes=$2 ;;
    --threads) threads=$2 ;;
    --clients) clients=$2 ;;
    --pipeline) pipeline=$2 ;;
    *) echo "memcached.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
port=$(env -u LD_PRELOAD /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# -m: room for every value (no eviction: each GET must hit); -U 0: no UDP; as root, -u.
memcached -l 127.0.0.1 -p "$port" -U 0 -t "$threads" -m 4096 -c 1024 -u "$(id -un)" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
load_and_get() {
    BENCH_DIR=$(dirname "$0") python3 - "$@" <<'PY'
import multiprocessing
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.environ["BENCH_DIR"])
import cache_values  # noqa: E402 (found through BENCH_DIR)

mode, port, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


class ServerGone(Exception):
    """memcached closed a connection or did not start (the kernel's OOM killer may have
    ended it): raised, not exited, so that a client in the pool fails the whole script
    instead of leaving the pool waiting for its share."""


def connect():
    for _ in range(100):
        try:
            s = socket.create_connection(("127.0.0.1", port))
            # A server that stops answering fails the run instead of hanging it.
            s.settimeout(300)
            return s
        except OSError:
            time.sleep(0.1)
    raise ServerGone("memcached.sh: memcached did not start")


def load():
    s = connect()
    batch = []
    for k, v in cache_values.values(n, size):
        batch.append("set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(v), v))
        if len(batch) == 256:
            s.sendall("".join(batch).encode())
            batch = []
    s.sendall(("".join(batch) + "version\r\n").encode())
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = s.recv(4096)
        if not chunk:
            raise ServerGone("memcached.sh: the server closed the connection while loading")
        reply += chunk
    if not reply.startswith(b"VERSION"):
        sys.exit("memcached.sh: loading failed: %r" % reply[:200])
    print("%d keys loaded" % n)


def client(args):
    c, gets, pipeline, nr_keys = args
    rng = random.Random(1000 + c)
    s = connect()
    hits = 0
    done = 0
    while done < gets:
        batch = min(pipeline, gets - done)
        s.sendall(("get " + " ".join(cache_values.key(rng.randrange(nr_keys)) for _ in range(batch)) + "\r\n").encode())
        buf = bytearray()
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ServerGone("memcached.sh: the server closed the connection")
            buf += chunk
        hits += buf.count(b"VALUE ")
        done += batch
    return hits


def get(nr_keys, gets, clients, pipeline):
    shares = [gets // clients + (c < gets % clients) for c in range(clients)]
    with multiprocessing.Pool(clients) as pool:
        t0 = time.monotonic()
        hits = pool.map(client, [(c, shares[c], pipeline, nr_keys) for c in range(clients)])
        took = time.monotonic() - t0
    rate = gets / took
    print("GET: %.2f requests per second" % rate, file=sys.stderr)
    print("%d GETs, %d hits" % (gets, sum(hits)))
    return rate


try:
    if mode == "load":
        load()
    else:
        rate = get(n, int(sys.argv[7]), int(sys.argv[5]), int(sys.argv[6]))
        with open(sys.argv[8], "w") as f:
            f.write("%.0f\n" % rate)
except (ServerGone, OSError) as e:
    sys.exit(str(e))
PY
}
load_and_get load "$port" "$keys" "$value_bytes"
# How well the values that went out compressed (both sides, see compression.sh).
bash "$(dirname "$0")/compression.sh" "$server" || echo "memcached.sh: could not read the compression ratio" >&2
rate_file=$(mktemp)
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$rate_file"' EXIT
load_and_get get "$port" "$keys" "$value_bytes" "$clients" "$pipeline" "$gets" "$rate_file"
. "$(dirname "$0")/engine.sh"
engine=$(engine_name)
[ -z "${REAL_PROGRAMS_LOG:-}" ] || echo "$engine $(cat "$rate_file")" >>"$REAL_PROGRAMS_LOG"
