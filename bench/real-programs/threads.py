#!/usr/bin/env python3
"""pmbench (github blakecaldwell/pmbench, unmodified but for the two local fixes that
BENCHMARKS.md's "Threads" names) with 1, 2, 4 and 8 threads under uswap's two fault modes
and the kernel's zram, same limit, same sitting, and writes the "Threads" section of
BENCHMARKS.md (Markdown, on stdout or --out).

Each thread count is one `uswap bench --command` of engines uswap-signal, uswap-thread and
kernel-zram, interleaved, --runs times; figures are medians of pmbench's own rate (all
threads' accesses per second). The kernel's OOM kills are counted and each killed run is
run again (up to --oom-retries): never silently, the table says how many of how many tries.

Needs root (the kernel engine uses a memory cgroup and zram, and needs the system's swap to
be off) and a built pmbench source tree:

    sudo bench/real-programs/threads.py --pmbench ~/src/pmbench --runs 3

On a machine without zram, `--kernel file` compares with a swap file instead.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import HERE, ROOT, details_of, median, run_one, write_markdown  # noqa: E402

LIMIT = "256MiB"
PMBENCH_ARGS = "-m 1024 -s 1024 -r 80 -p uniform"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pmbench", required=True, help="a built pmbench source tree")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,2,4,8", help="thread counts, comma-separated")
    ap.add_argument("--seconds", type=int, default=20, help="pmbench's duration")
    ap.add_argument("--oom-retries", type=int, default=10)
    ap.add_argument("--kernel", choices=["zram", "file"], default="zram",
                    help="the kernel's swap device: zram (lz4), or a swap file where zram is missing")
    ap.add_argument("--uswap", default=os.path.join(ROOT, "target", "release", "uswap"))
    ap.add_argument("--out", help="write the Markdown here instead of stdout")
    args = ap.parse_args()
    if not os.access(args.uswap, os.X_OK):
        sys.exit(f"{args.uswap}: not built (cargo build --release)")
    pm = os.path.join(args.pmbench, "pmbench")
    kernel = f"kernel-{args.kernel}"
    engines = f"uswap-signal,uswap-thread,{kernel}"
    device = "zram (lz4)" if args.kernel == "zram" else "a swap file"
    lines = [
        f"`bench/real-programs/threads.py --runs {args.runs}` on {time.strftime('%Y-%m-%d')}, "
        f"Linux {os.uname().release}, {os.cpu_count()} CPUs: `pmbench {PMBENCH_ARGS} -j T {args.seconds}` "
        f"under a {LIMIT} limit, uswap on its default device (`zpool`, lz4) against the kernel's {device} "
        f"in a memory cgroup. Medians of pmbench's rate (all threads); `×kernel` over {kernel}'s; "
        "`×1 thread` over the same engine's rate at one thread; TLB shootdowns per major fault are the "
        "machine's (`/proc/interrupts`) over the run's major faults, in the median run.",
        "",
        "| threads | engine | accesses/s | ×kernel | ×1 thread | TLB/majflt | OOM kills / tries |",
        "|---|---|---|---|---|---|---|",
    ]
    details = []
    one_thread = {}
    for t in [int(x) for x in args.threads.split(",")]:
        cmd = f"bash {HERE}/pmbench.sh {pm} {args.seconds} {PMBENCH_ARGS} -j {t}"
        print(f"running: {t} thread(s)", file=sys.stderr)
        rc, table, err, rows, took, rates, _ = run_one(args.uswap, cmd, LIMIT, args.runs, engines,
                                                     args.oom_retries)
        by_engine = {r["engine"]: r for r in rows}
        base = median(rates[kernel]) if rates.get(kernel) else None
        for engine in engines.split(","):
            xs = rates.get(engine)
            r = by_engine.get(engine, {})
            kills = r.get("oom_kills") or 0
            tries = f"{kills} / {r.get('runs', 0) + kills}" if r else "all killed (details below)"
            if not xs:
                lines.append(f"| {t} | {engine} | - | - | - | - | {tries} |")
                continue
            m = median(xs)
            one_thread.setdefault(engine, m)
            tlb = (r.get("stats") or {}).get("tlb_shootdowns")
            majflt = r.get("pgmajfault")
            lines.append(f"| {t} | {engine} | {m:,.0f} | {f'{m / base:.2f}' if base else '-'} | "
                         f"{m / one_thread[engine]:.2f} | {f'{tlb / majflt:.2f}' if tlb and majflt else '-'} | {tries} |")
        details.extend(details_of(cmd, rc, took, table, err))
    lines.append("")
    lines.extend(details)
    write_markdown(lines, args.out)


if __name__ == "__main__":
    main()
