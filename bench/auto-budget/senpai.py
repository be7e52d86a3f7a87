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
`memory.high`; both make the cgroup reclaim at once when it is over. A hard limit that
reclaim cannot reach would OOM-kill the program (it did, at a CPython job's exit), so the
cgroup's OOM killer is turned off (`memory.oom_control`): its tasks wait instead, the wait
shows, and the law raises the limit as for the worst stall, as with `memory.high` (the
waits are counted: `oom_waits`).

Swap must be on (zram with lz4 for the comparison with uswap's zpool, set up by hand: the
script refuses to start without swap, saying how). Needs root.

Writes one JSON object per second to --log (time, limit, usage, zram's mem_used_total, PSI
total) and prints a summary JSON on exit: the run time, the median limit and memory (usage
plus zram) over the last 30 s but the exit, and when the limit settled (came within 10 % of
that median for good).

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


def swap_devices():
    """The swap devices on now (/proc/swaps, after its header)."""
    return [line.split()[0] for line in read("/proc/swaps").splitlines()[1:] if line.strip()]


def settled(history, memory):
    """The figures of a run's last 30 s but its last 2 (the program's exit): the median limit and
    memory (`memory(row)`), and when the limit came within 10 % of that median for good."""
    rows = [r for r in history[:-2] if r["t"] >= history[-1]["t"] - 30] if len(history) > 3 else history
    if not rows:
        return {"limit_bytes": None, "memory_bytes": None, "settled_s": None}
    median = lambda xs: sorted(xs)[len(xs) // 2]
    limit, mem = median([r["limit"] for r in rows]), median([memory(r) for r in rows])
    body = history[:-2] if len(history) > 3 else history
    t = next((r["t"] for i, r in enumerate(body) if all(abs(h["limit"] - limit) <= 0.1 * limit for h in body[i:])), None)
    return {"limit_bytes": limit, "memory_bytes": mem, "settled_s": t}


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
    if not swap_devices():
        # Without swap the cgroup cannot swap: its limit stays where the program's memory is
        # and the run compares uswap with no swap at all (a sitting did, once, unnoticed).
        sys.exit("senpai.py: no swap is on (/proc/swaps); set up zram with lz4 first, e.g. "
                 "echo lz4 > /sys/block/zram0/comp_algorithm; echo 8G > /sys/block/zram0/disksize; "
                 "mkswap /dev/zram0; swapon /dev/zram0 (and afterwards swapoff /dev/zram0; "
                 "echo 1 > /sys/block/zram0/reset)")
    name = f"senpai-{os.getpid()}"
    v1, v2 = os.path.join(V1, name), os.path.join(V2, name)
    os.mkdir(v1)
    os.mkdir(v2)
    write(os.path.join(v1, "memory.limit_in_bytes"), conf.max)
    # A hard limit the cgroup cannot reclaim down to (a burst of refaults) would OOM-kill
    # the program; with the OOM killer off its tasks wait instead, and the loop below raises
    # the limit as for the worst stall (PSI does not count tasks waiting on a memcg OOM, so a
    # law on PSI alone would go on probing down while they wait): v2's memory.high throttles
    # instead of killing, which this stands in for.
    write(os.path.join(v1, "memory.oom_control"), 1)

    def enter():
        write(os.path.join(v1, "cgroup.procs"), 0)
        write(os.path.join(v2, "cgroup.procs"), 0)

    log = open(conf.log, "w") if conf.log else None
    senpai = Senpai(conf)
    start = time.monotonic()
    child = subprocess.Popen(cmd, preexec_fn=enter)
    history = []
    limit = None
    # Whether a limit was accepted yet: Senpai starts from memory.current, and a program
    # still allocating fast may refuse the first (EBUSY); it starts again from what the
    # cgroup holds at the next tick, not from the ceiling (that run was never limited).
    started = False
    ooms = 0
    last_total = psi_some_total_us(v2)
    try:
        while child.poll() is None:
            time.sleep(1)
            usage = int(read(os.path.join(v1, "memory.usage_in_bytes")))
            total = psi_some_total_us(v2)
            under_oom = "under_oom 1" in read(os.path.join(v1, "memory.oom_control"))
            if not started:
                limit = max(usage, conf.min)  # Senpai starts from memory.current
            elif under_oom:
                limit = max(limit, usage) * (1 + conf.max_backoff)
                senpai.integral, senpai.grace = 0.0, conf.interval - 1
                ooms += 1
            else:
                limit = senpai.tick(total - last_total, limit)
            limit = int(max(conf.min, min(conf.max, limit))) & ~4095
            last_total = total
            try:
                write(os.path.join(v1, "memory.limit_in_bytes"), limit)
                started = True
            except OSError:
                # EBUSY: the kernel could not reclaim down to it (v1 refuses such a limit);
                # Senpai's own reset: carry on from what the cgroup holds.
                limit = int(read(os.path.join(v1, "memory.limit_in_bytes")))
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
    print(json.dumps({"status": child.returncode, "seconds": round(elapsed, 2), "oom_waits": ooms,
                      **settled(history, lambda r: r["usage"] + r["zram"])}))
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
