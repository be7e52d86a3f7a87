#!/bin/bash
# Prints how well the pages swapped out so far compressed, on whichever side this runs:
#   compression ENGINE: data D.DDx, memory M.MMx (N pages)
# data: bytes of the pages over the bytes of their compressed data; memory: over the memory
# the device holds for them (its allocator's rounding and tables included). Under uswap
# (USWAP_FAULT_MODE set) it asks `uswap stat PID` for the process's compressed pools
# (stored_pages, compressed_bytes, pool_bytes); under the kernel it reads zram's mm_stat
# (orig_data_size, compr_data_size, mem_used_total). The line goes to stderr and, when
# REAL_PROGRAMS_LOG is set, as "ENGINE ratio DATA MEMORY" to that file (for run.py).
# Usage: compression.sh PID
set -euo pipefail
pid=$1
. "$(dirname "$0")/engine.sh"
engine=$(engine_name)
case $engine in
uswap-*)
    read -r data memory pages < <(env -u LD_PRELOAD "${USWAP_BIN:-uswap}" stat "$pid" --json --sum |
        env -u LD_PRELOAD python3 -c '
import json, sys
devs = json.loads(sys.stdin.readline())["stats"].get("devices", [])
b = [d["backend"] for d in devs if d.get("backend") and d["backend"].get("stored_pages")]
pages = sum(x["stored_pages"] for x in b)
comp = sum(x["compressed_bytes"] for x in b)
pool = sum(x["pool_bytes"] for x in b)
print("%.2f %.2f %d" % (pages * 4096 / comp if comp else 0, pages * 4096 / pool if pool else 0, pages))')
    ;;
kernel-zram)
    read -r orig compr used _ < /sys/block/zram0/mm_stat
    data=$(awk -v o="$orig" -v c="$compr" 'BEGIN { printf "%.2f", c ? o / c : 0 }')
    memory=$(awk -v o="$orig" -v u="$used" 'BEGIN { printf "%.2f", u ? o / u : 0 }')
    pages=$((orig / 4096))
    ;;
*) exit 0 ;; # a swap file stores pages as they are
esac
echo "compression $engine: data ${data}x, memory ${memory}x ($pages pages)" >&2
[ -z "${REAL_PROGRAMS_LOG:-}" ] || echo "$engine ratio $data $memory" >>"$REAL_PROGRAMS_LOG"
