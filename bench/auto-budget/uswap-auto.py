#!/usr/bin/env python3
"""`uswap run --auto` with the same record as senpai.py: runs CMD under `uswap run --auto=TARGET
--limit MAX`, asks `uswap stat --json --sum` for the tree's figures once a second (the limit
`--auto` holds, the resident pages, the compressed pool), and prints a summary JSON on exit:
the run time, the median limit and memory (resident plus pool) over the last 30 s but the
exit, and when the limit settled (came within 10 % of that median for good). --log gets one
JSON line a second.

    bench/auto-budget/uswap-auto.py --target 0.01 --log uswap.jsonl -- python3 job.py
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from senpai import settled  # noqa: E402  (the same summary on both sides)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, default=0.01)
    p.add_argument("--max", default="64GiB", help="--limit: the ceiling")
    p.add_argument("--uswap", default=os.path.join(ROOT, "target/release/uswap"))
    p.add_argument("--idle-age", help="uswap run's --idle-age (default: its own, `never` under --auto)")
    p.add_argument("--device", help="uswap run's --device (default: its own, a zpool)")
    p.add_argument("--tier-age", help="uswap run's --tier-age (with a --device of two tiers, such as zpool,zpool:zstd-1)")
    p.add_argument("--log")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    conf = p.parse_args()
    cmd = conf.cmd[1:] if conf.cmd[:1] == ["--"] else conf.cmd
    if not cmd:
        p.error("give the program after --")
    log = open(conf.log, "w") if conf.log else None
    start = time.monotonic()
    aging = ["--idle-age", conf.idle_age] if conf.idle_age else []
    aging += ["--device", conf.device] if conf.device else []
    aging += ["--tier-age", conf.tier_age] if conf.tier_age else []
    run = subprocess.Popen([conf.uswap, "run", f"--auto={conf.target}", "--limit", conf.max] + aging + ["--"] + cmd)
    history = []
    while run.poll() is None:
        time.sleep(1)
        out = subprocess.run([conf.uswap, "stat", "--json", "--sum", str(run.pid)], capture_output=True, text=True)
        try:
            st = json.loads(out.stdout.splitlines()[0])["stats"]
        except (IndexError, KeyError, ValueError):
            continue  # not started yet, or just ended
        page = 4096
        pool = sum((d.get("backend") or {}).get("pool_bytes", 0) for d in st.get("devices", []))
        row = {"t": round(time.monotonic() - start, 2), "limit": st["limit_pages"] * page,
               "resident": st["resident_pages"] * page, "pool": pool,
               "stall_s": st.get("stall", {}).get("seconds_total", 0),
               "swapcache": st.get("swapcache_pages", 0) * page,
               "idle_10s": st.get("idle", {}).get("idle_10s_bytes", 0)}
        history.append(row)
        if log:
            log.write(json.dumps(row) + "\n")
            log.flush()
    elapsed = time.monotonic() - start
    print(json.dumps({"status": run.returncode, "seconds": round(elapsed, 2),
                      **settled(history, lambda r: r["resident"] + r["pool"])}))
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()
