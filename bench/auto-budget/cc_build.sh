#!/bin/sh
# A compiler as the program: gcc -O2 on one generated translation unit of FUNCS functions
# (default 2000, about 20k lines, 15 s a compile here; cc1 grows to some 450 MiB, which it keeps and mostly
# leaves alone while it optimizes one function after another), compiled over and over for
# SECONDS (default 90). Prints the compiles done and their rate: the rate is what a limit
# slows. Usage: cc_build.sh [SECONDS] [FUNCS]
set -eu
seconds=${1:-90}
funcs=${2:-2000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
env -u LD_PRELOAD /usr/bin/python3 - "$funcs" > "$dir/big.c" <<'PY'
import sys
n = int(sys.argv[1])
print("#include <stdint.h>")
for i in range(n):
    print(f"""static uint64_t f{i}(const uint64_t *a, int n) {{
    uint64_t s = {i}u, t = {i * 7 + 1}u;
    for (int k = 0; k < n; k++) {{
        s += (a[k] * {2 * i + 1}u) ^ (a[k] >> {i % 13 + 1});
        t = (t << 3) ^ (s * {i % 29 + 3}u) ^ a[(k + {i % 7}) % n];
        if ((s ^ t) & {1 << (i % 11)}u) s -= t / {i % 5 + 2}u; else t += s % {i % 9 + 2}u;
    }}
    return s ^ (t << 1);
}}""")
print("uint64_t all(const uint64_t *a, int n) {\n    uint64_t s = 0;")
for i in range(n):
    print(f"    s += f{i}(a, n);")
print("    return s;\n}")
PY
start=$(date +%s.%N)
compiles=0
now() { awk -v s="$start" -v t="$(date +%s.%N)" 'BEGIN { printf "%.2f", t - s }'; }
while awk -v e="$(now)" -v m="$seconds" 'BEGIN { exit !(e < m) }'; do
    gcc -O2 -c -o "$dir/big.o" "$dir/big.c"
    compiles=$((compiles + 1))
done
elapsed=$(now)
echo "compiles $compiles in ${elapsed}s: $(awk -v c="$compiles" -v e="$elapsed" 'BEGIN { printf "%.4f", c / e }')/s"
