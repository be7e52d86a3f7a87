#!/usr/bin/env python3
"""Memory per swapped page: unmodified programs under the same limit, each swapping to a
compressed RAM store, and what that store holds per page it stores, sampled twice a second.

Engines (interleaved, --runs times each):
  uswap-lz4         `uswap run` on its default device, a zpool compressed with lz4
  uswap-zstd        `uswap run --device zpool:zstd-1`: every page zstd level 1
  uswap-zstd-unit   `uswap run --device zpool:zstd-1:unit=16KiB`: zstd level 1, the pages of a
                    write compressed four at a time (docs/devices.md, "Units of pages")
  uswap-zstd-dict   `uswap run --device zpool:zstd-1:dict`: zstd level 1 with a dictionary the
                    pool trains on the program's first pages (docs/devices.md, "A dictionary")
  uswap-zstd-unit-dict  `uswap run --device zpool:zstd-1:unit=16KiB:dict`: both
  uswap-lz4+zstd    `uswap run --device zpool,zpool:zstd-1 --idle-age AGE`: pages go to the
                    lz4 pool, and those left untouched twice AGE move down to the zstd one
                    (recompression of cold pages; AGE also sends idle resident pages out)
  uswap-lz4+zstd-dict  `uswap run --device zpool,zpool:zstd-1:dict --tier-age TIER_AGE`: pages
                    go to the lz4 pool and move down to a zstd pool with a dictionary once out
                    of RAM TIER_AGE untouched, recompressed by the background reclaimer
  kernel-zram       `uswap bench --engines kernel-zram`: a memory cgroup with the limit and
                    swap on zram (lz4), as the kernel does it
  uswap-lz4-before  with --before USWAP: uswap-lz4 with another build (to compare two builds)

A sample is the store's bytes over the pages it stores: uswap's pools' `pool_bytes` and
`codec_bytes` (their compression workspaces and contexts) over `stored_pages` (the tree's,
`uswap stat --json --sum`), zram's `mem_used_total` (its per-CPU streams not counted) over
`orig_data_size / 4096` (/sys/block/zram0/mm_stat). A run's figure is the median of its
samples taken while the store held at least half its most pages (the steady part), beside
its peak memory (`pool_peak_bytes` with the codecs', zram's `mem_used_max`) and its wall time (pmbench, with
--pmbench TREE, a built source tree: its own rate, since it runs a fixed 20 s). Figures are
medians over the runs. Needs root for the kernel side (and no other swap on).

    sudo bench/density/run.py --runs 3 --pmbench ~/src/pmbench > density.md
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RP = os.path.join(ROOT, "bench", "real-programs")
PAGE = 4096


def programs(pmbench=None):
    """(name, command, limit, by_rate): a program by_rate runs for a fixed time and logs its
    own rate to $REAL_PROGRAMS_LOG (pmbench.sh), which is its speed instead of the wall time."""
    py = shlex.quote(sys.executable)
    rows = [
        ("redis-server, 500k x 1,000-byte mixed values, GET -P 16 -c 4",
         f"bash {RP}/redis.sh 500000 1000000 --value-bytes 1000 --pipeline 16 --clients 4", "192MiB"),
        ("sqlite3 :memory:, indexes, a join and a sort", f"sh -c 'sqlite3 < {RP}/sqlite.sql'", "128MiB"),
        ("CPython: a dict of 1M records, 100k probes", f"{py} {RP}/dict_job.py", "128MiB"),
        ("GNU sort -S 600M of 3M lines", f"bash {RP}/sort.sh", "160MiB"),
    ]
    rows = [(n, c, l, False) for n, c, l in rows]
    if pmbench:
        # -i: pmbench's own "garbage" fill, one pseudo-random byte in four; without it the
        # pages are zeros but for the words the benchmark writes.
        pm = shlex.quote(os.path.join(pmbench, "pmbench"))
        rows.append(("pmbench -i -m 1024 -s 1024 -r 80, 20 s (uniform)",
                     f"bash {RP}/pmbench.sh {pm} 20 -i -m 1024 -s 1024 -r 80 -j 1", "256MiB", True))
    return rows


def logged_rate(path):
    """The last rate a program's script logged (pmbench.sh: "ENGINE RATE"), or None."""
    try:
        with open(path) as f:
            lines = f.read().split()
        return float(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


class Sampler(threading.Thread):
    """Calls `read()` twice a second until stopped; keeps (stored_pages, bytes, peak)."""

    def __init__(self, read):
        super().__init__(daemon=True)
        self.read, self.samples, self.done = read, [], threading.Event()

    def run(self):
        while not self.done.wait(0.5):
            try:
                s = self.read()
            except Exception:  # not started yet, or gone
                s = None
            if s:
                self.samples.append(s)

    def figures(self):
        if not self.samples:
            return None
        most = max(p for p, _, _ in self.samples)
        steady = [b / p for p, b, _ in self.samples if p > 0 and p * 2 >= most]
        return {"bytes_per_page": statistics.median(steady), "stored_pages_max": most,
                "peak_bytes": max(k for _, _, k in self.samples)}


def uswap_stat(uswap, pid):
    out = subprocess.run([uswap, "stat", "--json", "--sum", str(pid)], capture_output=True, text=True, timeout=5)
    st = json.loads(out.stdout.splitlines()[0])["stats"]
    b = [d["backend"] for d in st.get("devices", []) if d.get("backend") and "pool_bytes" in d["backend"]]
    # The codecs' workspaces and contexts (`codec_bytes`, not in `pool_bytes`) are memory the
    # store costs too; a build before they were reported counts without them.
    codec = sum(x.get("codec_bytes", 0) for x in b)
    held = sum(x["pool_bytes"] for x in b) + codec
    return (sum(x["stored_pages"] for x in b), held, st.get("pool_peak_bytes", 0) + codec)


def zram_stat():
    with open("/sys/block/zram0/mm_stat") as f:
        orig, _compr, used, _limit, used_max = [int(x) for x in f.read().split()[:5]]
    return (orig // PAGE, used, used_max)


def run_uswap(uswap, cmd, limit, device_args, env):
    argv = [uswap, "run", "--limit", limit] + device_args + ["--", "sh", "-c", cmd]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    s = Sampler(lambda: uswap_stat(uswap, p.pid))
    s.start()
    err = p.communicate()[1]
    took = time.monotonic() - t0
    s.done.set()
    s.join()
    return p.returncode, took, s.figures(), err


def run_kernel(uswap, cmd, limit, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    argv = [uswap, "bench", "--command", cmd, "--limit", limit, "--engines", "kernel-zram", "--runs", "1",
            "--json", out, "--oom-retries", "0"]
    s = Sampler(lambda: zram_stat() if os.path.exists("/sys/block/zram0/mm_stat") else None)
    s.start()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    s.done.set()
    s.join()
    took = None
    try:
        with open(out) as f:
            rows = json.load(f)
        took = rows[0].get("seconds") or rows[0].get("wall_seconds")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    os.unlink(out)
    return p.returncode, took, s.figures(), p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--uswap", default=os.path.join(ROOT, "target/release/uswap"))
    ap.add_argument("--idle-age", default="5s", help="uswap-lz4+zstd's --idle-age")
    ap.add_argument("--tier-age", default="1s", help="uswap-lz4+zstd-dict's --tier-age")
    ap.add_argument("--pmbench", help="a built pmbench source tree: adds pmbench, by its rate")
    ap.add_argument("--only", help="run only the programs whose name contains this")
    ap.add_argument("--json", help="also write every run's figures here")
    ap.add_argument("--engines", help="comma-separated engines to run (default: all); kernel-zram is the reference")
    ap.add_argument("--before", metavar="USWAP",
                    help="another build's uswap binary (its preload beside it): adds the engine uswap-lz4-before, "
                         "its default pool, to compare two builds in one sitting")
    args = ap.parse_args()
    def uswap_with(*device_args):
        return lambda c, l, v: run_uswap(args.uswap, c, l, list(device_args), v)

    engines = {
        "uswap-lz4": uswap_with(),
        "uswap-zstd": uswap_with("--device", "zpool:zstd-1"),
        "uswap-zstd-unit": uswap_with("--device", "zpool:zstd-1:unit=16KiB"),
        "uswap-zstd-dict": uswap_with("--device", "zpool:zstd-1:dict"),
        "uswap-zstd-unit-dict": uswap_with("--device", "zpool:zstd-1:unit=16KiB:dict"),
        "uswap-lz4+zstd": uswap_with("--device", "zpool,zpool:zstd-1", "--idle-age", args.idle_age),
        "uswap-lz4+zstd-dict": uswap_with("--device", "zpool,zpool:zstd-1:dict", "--tier-age", args.tier_age),
        "kernel-zram": lambda c, l, v: run_kernel(args.uswap, c, l, v),
    }
    if args.before:
        engines["uswap-lz4-before"] = lambda c, l, v: run_uswap(args.before, c, l, [], v)
    if args.engines:
        wanted = args.engines.split(",")
        unknown = [e for e in wanted if e not in engines]
        if unknown:
            sys.exit(f"unknown engine(s) {', '.join(unknown)}: pick from {', '.join(engines)}")
        engines = {e: f for e, f in engines.items() if e in wanted}
    everything = []
    print("| program | limit | engine | bytes per stored page | vs zram | peak store MiB "
          "| wall s (pmbench: accesses/s) | runs (failed) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cmd, limit, by_rate in programs(args.pmbench):
        if args.only and args.only not in name:
            continue
        runs = {e: [] for e in engines}
        failed = {e: 0 for e in engines}
        for _ in range(args.runs):
            for e, f in engines.items():
                with tempfile.NamedTemporaryFile(prefix="density-rate-", delete=False) as log:
                    env = dict(os.environ, REAL_PROGRAMS_LOG=log.name)
                rc, took, fig, err = f(cmd, limit, env)
                speed = logged_rate(log.name) if by_rate else took
                os.unlink(log.name)
                rate = speed if by_rate else None
                everything.append({"program": name, "engine": e, "rc": rc, "seconds": took, "rate": rate,
                                   "figures": fig})
                if rc != 0 or fig is None or speed is None:
                    failed[e] += 1
                    print(f"{name} / {e}: status {rc}: {err.strip()[-300:]}", file=sys.stderr)
                    continue
                runs[e].append((fig["bytes_per_page"], fig["peak_bytes"], speed))
        zram = statistics.median([b for b, _, _ in runs["kernel-zram"]]) if runs.get("kernel-zram") else None
        for e, xs in runs.items():
            if not xs:
                print(f"| {name} | {limit} | {e} | - | - | - | - | 0 ({failed[e]}) |")
                continue
            b = statistics.median([x[0] for x in xs])
            vs = f"{b / zram:.2f}" if zram else "-"
            peak = statistics.median([x[1] for x in xs]) / (1 << 20)
            speed = statistics.median([x[2] for x in xs])
            speed = f"{speed:,.0f}" if by_rate else f"{speed:.1f}"
            print(f"| {name} | {limit} | {e} | {b:.0f} | {vs} | {peak:.1f} | {speed} | {len(xs)} ({failed[e]}) |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
