#!/usr/bin/env python3
"""A Senpai-style controller of the kernel's swap, to run a program beside `uswap run --auto`.

Runs CMD in a cgroup-v1 memory cgroup (this machine's memory controller) and a cgroup-v2
cgroup (for its `memory.pressure`, PSI, which v2 keeps for every cgroup), and moves the v1
cgroup's `memory.limit_in_bytes` once a second by Senpai's law (facebookincubator/senpai,
`senpai.py`), with Senpai's defaults except the target:

* the target is a share of wall time (`--target`, 1 % as uswap's default), turned into
  Senpai's "cumulative stall microseconds per interval" (`--interval` seconds, 6 by default);
* every second the growth of PSI's `some total` is added to an integral; above the target
  the limit grows by `max_backoff * min(1, (integral/target/coeff_backoff)^2)` at once (1.0
  and 20); otherwise, once an interval has passed, it shrinks by
  `max_probe * min(1, (target/integral/coeff_probe)^2)` (0.01 and 10); after either, the
  integral restarts and the next probe waits an interval;
* the limit starts at the cgroup's usage (Senpai resets it to `memory.current`), and stays
  within `--min` and `--max`.

Differences from Senpai: cgroup v1's `limit_in_bytes` is a hard limit where Senpai sets v2's
`memory.high`; both make the cgroup reclaim at once when it is over, and with swap on the
hard limit does not OOM while there is swap.

Swap must be on (zram with lz4 for the comparison with uswap's zpool: `uswap bench` sets it
up for its kernel-zram engine; or by hand). Needs root.

Writes one JSON object per second to --log (time, limit, usage, zram's mem_used_total, PSI
total) and prints a summary JSON on exit: the run time, the limit and memory (usage plus
zram) at the end, and when the limit settled (stayed within 10 % of its final value).

    sudo bench/auto-budget/senpai.py --target 0.01 --log senpai.jsonl -- python3 job.py
"""
import argparse
import json
import os
import subprocess
import sys
import time

V1 = "/sys/fs/cgroup/memory"
V2 = "/sys/fs/cgroup/unified"


def read(path):
    with open(path) as f:
        return f.read()


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def psi_some_total_us(v2):
    return int(read(os.path.join(v2, "memory.pressure")).split("\n")[0].split("total=")[1])


def zram_used_bytes():
    total = 0
    for d in os.listdir("/sys/block"):
        if d.startswith("zram"):
            try:
                total += int(read(f"/sys/block/{d}/mm_stat").split()[2])
            except (OSError, IndexError, ValueError):
                pass
    return total


class Senpai:
    """Senpai's law (`tick`), as in its `senpai.py`."""

    def __init__(self, conf):
        self.conf = conf
        self.target_us = conf.target * conf.interval * 1e6
        self.integral = 0.0
        self.grace = conf.interval

    def tick(self, delta_us, limit):
        c = self.conf
        self.integral += delta_us
        if self.integral > self.target_us:
            err = self.integral / self.target_us
            adj = min((err / c.coeff_backoff) ** 2 * c.max_backoff, c.max_backoff)
            self.integral, self.grace = 0.0, c.interval - 1
            return limit * (1 + adj)
        if self.grace:
            self.grace -= 1
            return limit
        err = self.target_us / max(self.integral, 1)
        adj = min((err / c.coeff_probe) ** 2 * c.max_probe, c.max_probe)
        self.integral, self.grace = 0.0, c.interval - 1
        return limit * (1 - adj)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, default=0.01, help="stall share of wall time (0.01: 1 %%)")
    p.add_argument("--interval", type=int, default=6)
    p.add_argument("--max-probe", type=float, default=0.01)
    p.add_argument("--max-backoff", type=float, default=1.0)
    p.add_argument("--coeff-probe", type=float, default=10)
    p.add_argument("--coeff-backoff", type=float, default=20)
    p.add_argument("--min", type=int, default=16 << 20, help="bytes")
    p.add_argument("--max", type=int, default=64 << 30, help="bytes")
    p.add_argument("--log", help="one JSON line a second")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    conf = p.parse_args()
    cmd = conf.cmd[1:] if conf.cmd[:1] == ["--"] else conf.cmd
    if not cmd:
        p.error("give the program after --")
    name = f"senpai-{os.getpid()}"
    v1, v2 = os.path.join(V1, name), os.path.join(V2, name)
    os.mkdir(v1)
    os.mkdir(v2)
    write(os.path.join(v1, "memory.limit_in_bytes"), conf.max)

    def enter():
        write(os.path.join(v1, "cgroup.procs"), 0)
        write(os.path.join(v2, "cgroup.procs"), 0)

    log = open(conf.log, "w") if conf.log else None
    senpai = Senpai(conf)
    start = time.monotonic()
    child = subprocess.Popen(cmd, preexec_fn=enter)
    history = []
    limit = None
    last_total = psi_some_total_us(v2)
    try:
        while child.poll() is None:
            time.sleep(1)
            usage = int(read(os.path.join(v1, "memory.usage_in_bytes")))
            total = psi_some_total_us(v2)
            if limit is None:
                limit = max(usage, conf.min)  # Senpai starts from memory.current
            else:
                limit = senpai.tick(total - last_total, limit)
            limit = int(max(conf.min, min(conf.max, limit))) & ~4095
            last_total = total
            write(os.path.join(v1, "memory.limit_in_bytes"), limit)
            row = {"t": round(time.monotonic() - start, 2), "limit": limit, "usage": usage,
                   "zram": zram_used_bytes(), "psi_some_us": total}
            history.append(row)
            if log:
                log.write(json.dumps(row) + "\n")
                log.flush()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        elapsed = time.monotonic() - start
        for d in (v1, v2):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)
    end = history[-1] if history else {"limit": 0, "usage": 0, "zram": 0}
    settled = next((r["t"] for i, r in enumerate(history)
                    if all(abs(h["limit"] - end["limit"]) <= 0.1 * end["limit"] for h in history[i:])), None)
    print(json.dumps({"status": child.returncode, "seconds": round(elapsed, 2), "limit_bytes": end["limit"],
                      "usage_bytes": end["usage"], "zram_bytes": end["zram"],
                      "memory_bytes": end["usage"] + end["zram"], "settled_s": settled}))
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
