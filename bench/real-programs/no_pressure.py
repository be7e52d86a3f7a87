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

Then the C build once more under a limit it does reach (--pressure-limit, a third of its
peak), on the compressed pool and on a file device in /var/tmp: whether the library it
makes is byte for byte the plain build's, and what the device held for the tree at its
peak against the pages written out.

    bench/real-programs/no_pressure.py --runs 3 --out /tmp/no-pressure.md

With --before OLD/uswap, an older build runs too, alternated with the others, in a column
of its own (what a change did, in one sitting).
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
        f.write(f"libzstd.a: {' '.join(objs)}\n\tar rcsD $@ $^\n")
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


def build_under_pressure(uswap, build_dir, limit, device):
    """`make -j2` of the build under `uswap run --limit LIMIT --device DEVICE`: (seconds,
    sha256 of the library, stats)."""
    subprocess.run(["make", "-s", "-C", build_dir, "clean"], check=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        took = timed([uswap, "run", "--limit", limit, "--device", device, "--stats-json", f.name, "--",
                      "make", "-s", "-j2", "-C", build_dir])
        stats = json.load(open(f.name))
    return took, sha256(os.path.join(build_dir, "libzstd.a")), stats


def sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def pressure_rows(uswap, build_dir, limit):
    """The C build plain, then under a limit on the pool and on a file device: whether the
    library is the same, and what the devices held."""
    subprocess.run(["make", "-s", "-C", build_dir, "clean"], check=True)
    plain_s = timed(["make", "-s", "-j2", "-C", build_dir])
    want = sha256(os.path.join(build_dir, "libzstd.a"))
    rows = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as swap_dir:
        for device in ["zpool", f"file:{swap_dir}"]:
            took, got, st = build_under_pressure(uswap, build_dir, limit, device)
            rows.append((device.split(":")[0], took, got == want, st))
            print(f"under {limit} on {device}: {took:.2f} s, same library: {got == want}", file=sys.stderr)
    return plain_s, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--uswap", default=os.path.join(ROOT, "target", "release", "uswap"))
    ap.add_argument("--out")
    ap.add_argument("--before", help="an older build's uswap, timed alongside (a column of its own)")
    ap.add_argument("--pressure-limit", default="64MiB",
                    help="the limit of the C build under pressure (a third of its peak here)")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        nr_files = make_build_dir(zstd_sources(), tmp)
        plain_s, pressure = pressure_rows(args.uswap, tmp, args.pressure_limit)
        rows = []
        for name, cmd in programs(tmp):
            plain, under, before = [], [], []
            for _ in range(args.runs):
                plain.append(timed(["sh", "-c", cmd]))
                under.append(timed([args.uswap, "run", "--limit", LIMIT, "--", "sh", "-c", cmd]))
                if args.before:
                    before.append(timed([args.before, "run", "--limit", LIMIT, "--", "sh", "-c", cmd]))
            p, u = median(plain), median(under)
            rows.append((name, p, u, plain, under, before))
            print(f"{name}: plain {p:.2f} s, uswap run {u:.2f} s ({p / u:.2f}x)"
                  + (f", before {median(before):.2f} s ({p / median(before):.2f}x)" if before else ""), file=sys.stderr)
    kernel = os.uname().release
    lines.append(f"Machine: {os.cpu_count()} vCPUs, Linux {kernel}; `uswap run --limit {LIMIT}` (never reached), "
                 f"default device (zpool) and mode (auto); {args.runs} runs each, alternated; the C build compiles "
                 f"{nr_files} files.")
    lines.append("")
    before_head = " | the build before (median) | its speed vs plain" if args.before else ""
    lines.append(f"| program | plain (median) | under `uswap run` (median) | speed vs plain{before_head} | "
                 f"runs plain / under uswap{' / before' if args.before else ''} (s) |")
    lines.append("|---|---|---|---|---|" + ("---|---|" if args.before else ""))
    for name, p, u, plain, under, before in rows:
        runs = " / ".join(" ".join(f"{x:.2f}" for x in xs) for xs in [plain, under, before] if xs)
        b = f" {median(before):.2f} s | {p / median(before):.2f}x |" if before else ""
        lines.append(f"| {name} | {p:.2f} s | {u:.2f} s | {p / u:.2f}x |{b} {runs} |")
    lines.append("")
    lines.append(f"The same build under `uswap run --limit {args.pressure_limit}`, one run each (plain: {plain_s:.2f} s):")
    lines.append("")
    lines.append("| device | time | library identical to the plain build's | pages written out (pswpout) | "
                 "what the device held for the tree at its peak (pool: memory; file: disk) | resident peak |")
    lines.append("|---|---|---|---|---|---|")
    for device, took, same, st in pressure:
        written = st.get("pswpout", 0) * 4096
        peak = st.get("pool_peak_bytes", 0) if device == "zpool" else (st.get("device_peak_bytes") or [0])[0]
        lines.append(f"| {device} | {took:.2f} s | {'yes' if same else '**no**'} | {written / 2**20:.0f} MiB | "
                     f"{peak / 2**20:.0f} MiB | {st.get('resident_peak_bytes', 0) / 2**20:.0f} MiB |")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
