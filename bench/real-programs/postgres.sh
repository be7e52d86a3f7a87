#!/bin/bash
# A PostgreSQL server (Debian's postgresql package) in a new cluster: pgbench's tables at
# SCALE (100k rows each, default 30: 3M rows), then three clients at once, each one query
# with a large private working set (work_mem 256MB): a sort and aggregate of 3M md5 strings,
# a hash aggregate of 3M keys, and a hash join of the table with itself on md5. The server
# forks a backend per client (and parallel workers); its shared buffers (16 MB) are shared
# memory, which uswap does not page. Prints the three results, which must be the same
# under every engine; the queries' seconds go to stderr.
#
# Usage: postgres.sh [SCALE]. As root the server runs as the user postgres (it refuses
# root), through setpriv, which keeps the preloaded library (a set-user-ID su would drop
# it); for thread mode it keeps CAP_SYS_PTRACE, which thread mode's userfaultfd needs.
set -euo pipefail
scale=${1:-30}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/postgres" ] || { echo "postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 2; }
dir=$(mktemp -d /tmp/uswap-pg.XXXXXX)
as_user=()
if [ "$(id -u)" = 0 ]; then
    chown postgres "$dir"
    as_user=(setpriv --reuid=postgres --regid=postgres --init-groups --inh-caps=+sys_ptrace --ambient-caps=+sys_ptrace --)
fi
run() { "${as_user[@]}" "$@"; }
run "$bin/initdb" -D "$dir/data" --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
# Not through `run`: a function in the background is a subshell, which ignores SIGINT (the
# server's fast shutdown) as a non-interactive shell's background job does.
"${as_user[@]}" "$bin/postgres" -D "$dir/data" -k "$dir" -c listen_addresses= -c fsync=off -c shared_buffers=16MB \
    -c work_mem=256MB -c maintenance_work_mem=256MB -c max_parallel_workers_per_gather=2 -c jit=off \
    >"$dir/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until run "$bin/pg_isready" -q -h "$dir"; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "postgres did not start; its log:" >&2; cat "$dir/server.log" >&2; exit 1; }
    sleep 0.1
done
psql=(run psql -X -A -t -h "$dir" -d postgres)
"${psql[@]}" -q -c "CREATE DATABASE bench" >/dev/null
run "$bin/pgbench" -h "$dir" -i -s "$scale" -q bench >/dev/null
queries=(
    "SELECT md5(string_agg(x, '' ORDER BY x)) FROM (SELECT md5(aid::text) x FROM pgbench_accounts) s"
    "SELECT count(*), sum(h), md5(string_agg(k, '' ORDER BY k)) FROM (SELECT substr(md5(aid::text), 1, 6) k, count(*) h FROM pgbench_accounts GROUP BY 1) s"
    "SELECT count(*), sum(a.abalance + b.aid) FROM pgbench_accounts a JOIN pgbench_accounts b ON md5(a.aid::text) = md5(b.aid::text) WHERE a.aid % 2 = 0"
)
start=$(date +%s.%N)
pids=()
for q in 0 1 2; do
    run psql -X -A -t -h "$dir" -d bench -c "${queries[$q]}" >"$dir/result.$q" 2>&1 &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
end=$(date +%s.%N)
cat "$dir/result.0" "$dir/result.1" "$dir/result.2"
[ $status = 0 ] || { echo "postgres.sh: a query failed; the server's log:" >&2; tail -20 "$dir/server.log" >&2; exit 1; }
echo "postgres.sh: the three queries took $(echo "$end - $start" | bc) s" >&2
