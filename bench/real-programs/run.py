#!/usr/bin/env python3
"""Runs unmodified programs under uswap and under the kernel's swap, same limit, same
sitting, and writes the "Real programs" section of BENCHMARKS.md (Markdown, on stdout or
--out). Each program runs under `uswap bench --command` with the engines uswap-signal (what
`uswap run --fault-mode auto`, the default, picks for a program that links neither libaio
nor liburing), uswap-thread, kernel-zram and kernel-file, interleaved, --runs times, and the
figures are medians.

Needs root (the kernel engines use a memory cgroup and zram or a swap file, and need the
system's swap to be off), redis-server/redis-benchmark, memcached, sqlite3 and python3. pmbench and
usemem are built from source trees given with --pmbench and --usemem (they are not in
Debian); without them those rows are left out and the section says so.

    sudo bench/real-programs/run.py --runs 3 --pmbench ~/src/pmbench --usemem ~/src/vm-scalability
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENGINES = "uswap-thread,uswap-signal,kernel-zram,kernel-file"


def programs(args):
    """(name, command, limit) for every program to run."""
    py = shlex.quote(sys.executable)
    rows = [
        ("redis-server + redis-benchmark GET (150k x 4 KiB mixed values)", f"bash {HERE}/redis.sh 150000 200000", "192MiB"),
        ("redis-server, 500k x 1,000-byte mixed values, GET -P 16 -c 4",
         f"bash {HERE}/redis.sh 500000 1000000 --value-bytes 1000 --pipeline 16 --clients 4", "192MiB"),
        ("redis-server --io-threads 2, 500k x 1,000-byte mixed values, GET -P 16 -c 4",
         f"bash {HERE}/redis.sh 500000 1000000 --value-bytes 1000 --pipeline 16 --clients 4 --io-threads 2", "192MiB"),
        ("memcached -t 4, 500k x 1,000-byte mixed values, multi-key GETs of 16 from 4 clients",
         f"bash {HERE}/memcached.sh 500000 1000000 --value-bytes 1000 --threads 4 --clients 4 --pipeline 16", "192MiB"),
        ("memcached -t 4 under 384 MiB, 500k x 1,000-byte mixed values, multi-key GETs of 16 from 4 clients",
         f"bash {HERE}/memcached.sh 500000 1000000 --value-bytes 1000 --threads 4 --clients 4 --pipeline 16", "384MiB"),
        ("CPython: a dict of 1M records, 100k probes", f"{py} {HERE}/dict_job.py", "128MiB"),
        ("sqlite3 :memory:, indexes, a join and a sort", f"sh -c 'sqlite3 < {HERE}/sqlite.sql'", "128MiB"),
        ("GNU sort -S 600M of 3M lines", f"bash {HERE}/sort.sh", "160MiB"),
    ]
    if args.pmbench:
        pm = os.path.join(args.pmbench, "pmbench")
        for threads in (1, 2):
            rows.append((f"pmbench -m 1024 -s 1024 -r 80 -j {threads}, 20 s (uniform)",
                         f"bash {HERE}/pmbench.sh {pm} 20 -m 1024 -s 1024 -r 80 -j {threads}", "256MiB"))
    if args.usemem:
        um = os.path.join(args.usemem, "usemem")
        rows.append(("usemem --init-time -O -y -x -R -n 2 (800 MiB)", f"{um} --init-time -O -y -x -R -n 2 400m", "384MiB"))
    return rows


def run_one(uswap, cmd, limit, runs, engines, oom_retries=10):
    """Runs `cmd` under every engine; (status, table, stderr, JSON rows, seconds, rates,
    ratios): rates are what a program's script (pmbench.sh, redis.sh) logged, per engine,
    and ratios the (data, memory) compression ratios compression.sh logged for it."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as f:
        rate_log = f.name
    os.environ["REAL_PROGRAMS_LOG"] = rate_log
    os.environ["USWAP_BIN"] = uswap  # compression.sh asks it for the pools' figures
    argv = [uswap, "bench", "--command", cmd, "--limit", limit, "--engines", engines, "--runs", str(runs),
            "--json", out, "--oom-retries", str(oom_retries)]
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True)
    took = time.time() - t0
    table = p.stdout.strip()
    try:
        with open(out) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        rows = []
    os.unlink(out)
    rates, ratios = {}, {}
    with open(rate_log) as f:
        for line in f:
            words = line.split()
            if len(words) == 4 and words[1] == "ratio":
                ratios.setdefault(words[0], []).append((float(words[2]), float(words[3])))
            else:
                rates.setdefault(words[0], []).append(float(words[1]))
    os.unlink(rate_log)
    return p.returncode, table, p.stderr.strip(), rows, took, rates, ratios


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def ra_hit(row):
    s = row.get("stats") or {}
    ra, hit = s.get("swap_ra", 0), s.get("swap_ra_hit", 0)
    return f"{100 * hit / ra:.0f} %" if ra else "-"


def ra_unused(row):
    """uswap's read-ahead pages evicted unused, over pages read ahead (the kernel has no such count)."""
    s = row.get("stats") or {}
    ra, unused = s.get("swap_ra", 0), s.get("swap_ra_unused")
    return f"{100 * unused / ra:.0f} %" if ra and unused is not None else "-"


def memory_peak(row):
    """The memory the limit counted plus the swap device's own, at their peaks, MiB: the
    charged peak (uswap's resident peak of managed pages, or the kernel cgroup's peak charge,
    page cache included) plus the device peak (uswap's compressed pool, zram's
    `mem_used_max`; none for a swap file)."""
    charged = row.get("charged_peak_bytes")
    if charged is None:
        return "-"
    return f"{(charged + (row.get('swap_device_peak_bytes') or 0)) / 2**20:.0f}"


def rss_peak(row):
    """The largest process's RSS peak, MiB. Under uswap it holds everything the program cost:
    kept pages, the pool, memory uswap does not manage, the engine's tables. Under the kernel
    it holds the resident pages only (zram is outside the process)."""
    return f"{(row.get('rss_peak_bytes') or 0) / 2**20:.0f}"


def details_of(cmd, rc, took, table, err):
    """The Markdown that follows a section's tables for one `uswap bench` run: its command,
    exit status and table, and the end of its stderr when it failed."""
    out = [f"`{cmd}` (exit {rc}, {took:.0f} s):\n\n```text\n{table}\n```"]
    if rc != 0:
        out.append(f"stderr:\n\n```text\n{err[-2000:]}\n```")
    return out


def write_markdown(lines, path):
    """Writes a section's lines to `path`, or to stdout without one."""
    text = "\n".join(lines) + "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def oom_tries(row):
    """How many of the engine's tries the kernel's OOM killer ended, of how many: each kill is
    tried again (up to --oom-retries), never silently."""
    kills = row.get("oom_kills") or 0
    return f"{kills} / {row.get('runs', 0) + kills}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engines", default=ENGINES)
    ap.add_argument("--pmbench", help="a built pmbench source tree")
    ap.add_argument("--usemem", help="a built vm-scalability source tree (usemem)")
    ap.add_argument("--uswap", default=os.path.join(ROOT, "target", "release", "uswap"))
    ap.add_argument("--only", help="run only programs whose name contains this")
    ap.add_argument("--out", help="write the Markdown here instead of stdout")
    args = ap.parse_args()
    if not os.access(args.uswap, os.X_OK):
        sys.exit(f"{args.uswap}: not built (cargo build --release)")
    lines = ["## Real programs", ""]
    kernel = os.uname().release
    lines.append(f"`bench/real-programs/run.py --runs {args.runs}` on {time.strftime('%Y-%m-%d')}, Linux {kernel}, "
                 f"{os.cpu_count()} CPUs. Engines: {args.engines} (`uswap-*` on the default device `zpool`, "
                 "the like-for-like match of `kernel-zram`). Medians of the runs; `×zram` is kernel-zram's wall "
                 "time over the engine's (above 1: faster). `ra hit` is read-ahead pages used over pages read ahead "
                 "(uswap's `swap_ra_hit/swap_ra`, the kernel's from /proc/vmstat); `ra unused` is uswap's "
                 "read-ahead pages evicted unused over pages read ahead. `limit+device` is what the limit counted "
                 "at its peak plus the swap device's own memory at its peak: uswap's resident peak of managed pages "
                 "plus its compressed pool's peak, or the kernel cgroup's peak charge plus zram's `mem_used_max`. "
                 "`RSS peak` is the largest process's: under uswap everything the program cost (kept pages, pool, "
                 "memory uswap does not manage, the engine's tables), under the kernel its resident pages only. "
                 "`OOM kills / tries`: runs the kernel's OOM killer ended, each run again, of all the tries; "
                 "a program the kernel kills more often than --oom-retries allows has no kernel row, and its "
                 "details below say so.")
    lines.append("")
    if not args.pmbench or not args.usemem:
        lines.append("Left out this time: " + ", ".join(n for n, v in (("pmbench", args.pmbench), ("usemem", args.usemem)) if not v)
                     + " (give their built source trees with --pmbench/--usemem).")
        lines.append("")
    lines.append("| program | limit | engine | wall s | ×zram | major faults | pswpout | ra hit | ra unused "
                 "| limit+device MiB | RSS peak MiB | OOM kills / tries |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    details = []
    rate_lines = []
    ratio_lines = []
    for name, cmd, limit in programs(args):
        if args.only and args.only not in name:
            continue
        print(f"running: {name}", file=sys.stderr)
        rc, table, err, rows, took, rates, ratios = run_one(args.uswap, cmd, limit, args.runs, args.engines)
        for engine, xs in ratios.items():
            ratio_lines.append(f"| {name} | {engine} | {median([d for d, _ in xs]):.2f} | "
                               f"{median([m for _, m in xs]):.2f} | {len(xs)} |")
        if rates:
            base = median(rates.get("kernel-zram", [0])) or None
            for engine, xs in rates.items():
                m = median(xs)
                ratio = f"{m / base:.2f}" if base else "-"
                rate_lines.append(f"| {name} | {limit} | {engine} | {m:,.0f} | {ratio} | {len(xs)} |")
        for r in rows:
            speed = r.get("speed_vs_baseline")
            lines.append(f"| {name} | {limit} | {r['engine']} | {r['wall_seconds']:.2f} | "
                         f"{speed:.2f} | {r.get('pgmajfault', 0)} | {r.get('pswpout', 0)} | {ra_hit(r)} | "
                         f"{ra_unused(r)} | {memory_peak(r)} | {rss_peak(r)} | {oom_tries(r)} |" if speed is not None else
                         f"| {name} | {limit} | {r['engine']} | {r['wall_seconds']:.2f} | - | - | - | - | - | - | - "
                         f"| {oom_tries(r)} |")
        details.extend(details_of(cmd, rc, took, table, err))
    lines.append("")
    if rate_lines:
        lines.append("Programs by their own rate, the median of pmbench's accesses (all threads) or "
                     "redis-benchmark's or memcached.sh's GETs per second (`×zram`: over kernel-zram's; the wall times above are "
                     "the fixed duration, or the load, plus set-up):")
        lines.append("")
        lines.append("| program | limit | engine | accesses/s | ×zram | runs |")
        lines.append("|---|---|---|---|---|---|")
        lines.extend(rate_lines)
        lines.append("")
    if ratio_lines:
        lines.append("How well the pages that went out compressed, on both sides (`compression.sh`, read once a run "
                     "with the program loaded: uswap's pools by `uswap stat`, zram by `mm_stat`), medians: `data` is "
                     "the pages' bytes over their compressed bytes, `memory` over the memory the device holds for "
                     "them (its allocator's rounding and tables included):")
        lines.append("")
        lines.append("| program | engine | data ratio | memory ratio | runs |")
        lines.append("|---|---|---|---|---|")
        lines.extend(ratio_lines)
        lines.append("")
    lines.extend(details)
    write_markdown(lines, args.out)


if __name__ == "__main__":
    main()
