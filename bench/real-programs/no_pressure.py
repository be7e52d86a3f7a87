#!/usr/bin/env python3
"""What `uswap run` costs a program when memory is plentiful: real programs plain and under
`uswap run --limit 64GiB` (never reached; default device and mode), alternated, --runs
times each, median wall times. Writes the "Cost without memory pressure" section of
BENCHMARKS.md (Markdown, on stdout or --out).

The programs:
- a parallel C build: `make -j2` of zstd's library (its 30-odd C files at -O2, the sources
  the zstd-sys crate carries; `cargo fetch` brings them from crates.io, no other network);
- sqlite3 building, indexing and joining 1.2 M rows in memory (sqlite.sql);
- a CPython dict job (dict_job.py);
- a shell script that starts 600 short processes (`expr`, `cat`, and a subshell for `echo`).

    bench/real-programs/no_pressure.py --runs 3 --out /tmp/no-pressure.md
"""
import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIMIT = "64GiB"


def zstd_sources():
    """The zstd library's C sources the workspace's zstd-sys crate carries (fetched if need
    be), as a directory."""
    subprocess.run(["cargo", "fetch", "--quiet"], cwd=ROOT, check=True)
    meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1"], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout)
    pkg = next(p for p in meta["packages"] if p["name"] == "zstd-sys")
    lib = os.path.join(os.path.dirname(pkg["manifest_path"]), "zstd", "lib")
    if not os.path.isdir(lib):
        sys.exit(f"no zstd sources in {lib}")
    return lib


def make_build_dir(lib, dir):
    """A copy of `lib` with a Makefile that compiles every .c file and archives them."""
    shutil.copytree(lib, os.path.join(dir, "lib"))
    srcs = sorted(os.path.relpath(p, dir) for p in glob.glob(os.path.join(dir, "lib", "*", "*.c")))
    objs = [s[:-2] + ".o" for s in srcs]
    with open(os.path.join(dir, "Makefile"), "w") as f:
        f.write("CFLAGS = -O2 -DZSTD_DISABLE_ASM -Ilib -Ilib/common\n")
        f.write(f"libzstd.a: {' '.join(objs)}\n\tar rcs $@ $^\n")
        f.write("%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n")
        f.write(f"clean:\n\trm -f libzstd.a {' '.join(objs)}\n")
    return len(srcs)


def programs(build_dir):
    py = shlex.quote(sys.executable)
    script = ("i=0; while [ $i -lt 200 ]; do i=$(expr $i + 1); true; echo $i | cat > /dev/null; done")
    return [
        ("make -j2 of zstd's library (C, -O2)", f"make -s -C {build_dir} clean && make -s -j2 -C {build_dir}"),
        ("sqlite3 :memory:, 1.2 M rows, indexes, a join and a sort", f"sqlite3 < {HERE}/sqlite.sql"),
        ("CPython: a dict of 1M records, 100k probes", f"{py} {HERE}/dict_job.py"),
        ("sh: 600 short processes (expr, cat, and a subshell for echo)", script),
    ]


def timed(argv):
    t = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - t
    if r.returncode != 0:
        sys.exit(f"{argv} failed ({r.returncode}):\n{r.stderr}")
    return took


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--uswap", default=os.path.join(ROOT, "target", "release", "uswap"))
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        nr_files = make_build_dir(zstd_sources(), tmp)
        rows = []
        for name, cmd in programs(tmp):
            plain, under = [], []
            for _ in range(args.runs):
                plain.append(timed(["sh", "-c", cmd]))
                under.append(timed([args.uswap, "run", "--limit", LIMIT, "--", "sh", "-c", cmd]))
            p, u = median(plain), median(under)
            rows.append((name, p, u, plain, under))
            print(f"{name}: plain {p:.2f} s, uswap run {u:.2f} s ({p / u:.2f}x)", file=sys.stderr)
    kernel = os.uname().release
    lines.append(f"Machine: {os.cpu_count()} vCPUs, Linux {kernel}; `uswap run --limit {LIMIT}` (never reached), "
                 f"default device (zpool) and mode (auto); {args.runs} runs each, alternated; the C build compiles "
                 f"{nr_files} files.")
    lines.append("")
    lines.append("| program | plain (median) | under `uswap run` (median) | speed vs plain | runs plain / under uswap (s) |")
    lines.append("|---|---|---|---|---|")
    for name, p, u, plain, under in rows:
        runs = " ".join(f"{x:.2f}" for x in plain) + " / " + " ".join(f"{x:.2f}" for x in under)
        lines.append(f"| {name} | {p:.2f} s | {u:.2f} s | {p / u:.2f}x | {runs} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
