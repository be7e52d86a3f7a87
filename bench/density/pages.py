#!/usr/bin/env python3
"""Dumps the anonymous memory of real programs for `uswap/examples/page_units.rs` and
`page_dict.rs`: each runs plain (no uswap, no limit) until its data is built, then its
private writable mappings (anonymous and the heap) are read from /proc/PID/mem, in address
order: DIR/NAME.bin (the pages) and DIR/NAME.idx (the pages of each mapping). Programs:
sqlite3 (bench/real-programs/sqlite.sql, the session kept open), the CPython dict job
(dict_job.py, stopped at its end) and redis-server with 500k values of 1,000 bytes, half
random hex and half words (bench/real-programs/cache_values.py, which redis.sh loads),
and GNU sort's buffer over sort.sh's 3M lines, read but not yet sorted.
Needs sqlite3, python3, redis-server, redis-cli and sort; the dumps take about 1.9 GB.

    bench/density/pages.py --out /var/tmp/pages
    cargo run --release -p uswap --example page_units -- /var/tmp/pages/sqlite
    cargo run --release -p uswap --example page_dict -- /var/tmp/pages/sqlite
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RP = os.path.join(os.path.dirname(HERE), "real-programs")


def dump(pid, out):
    """Writes out.bin and out.idx from process `pid`'s private writable anonymous memory."""
    counts = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem, open(out + ".bin", "wb") as o:
        for line in maps:
            f = line.split()
            if f[1] != "rw-p" or (len(f) > 5 and f[5] != "[heap]"):
                continue
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue
            o.write(data)
            counts.append(len(data) // 4096)
    with open(out + ".idx", "w") as i:
        i.write(" ".join(map(str, counts)) + "\n")
    print(f"{out}: {sum(counts)} pages in {len(counts)} mappings", file=sys.stderr)


def cpu_ticks(pid):
    return sum(int(x) for x in open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[11:13])


def wait_idle(pid, limit_s=600):
    """Until the process used no CPU for a second."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        before = cpu_ticks(pid)
        time.sleep(1)
        if cpu_ticks(pid) == before:
            return
    sys.exit(f"process {pid} still busy after {limit_s} s")


def dump_once_fed(argv, data, out):
    """Runs `argv`, writes `data` to its input and keeps the input open (the program waits,
    idle, for the rest), then dumps it and ends it."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    p.stdin.write(data)
    p.stdin.flush()
    wait_idle(p.pid)
    dump(p.pid, out)
    p.kill()
    p.wait()


def sqlite(out):
    with open(os.path.join(RP, "sqlite.sql"), "rb") as f:
        dump_once_fed(["sqlite3"], f.read(), out)


def cpython(out):
    job = open(os.path.join(RP, "dict_job.py")).read()
    code = job + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not re.search(r"^State:\s+T", open(f"/proc/{p.pid}/status").read(), re.M):
        if time.time() > deadline:
            sys.exit("the CPython job did not reach its end")
        time.sleep(0.2)
    dump(p.pid, out)
    p.kill()
    p.wait()


def redis(out):
    loader = os.path.join(RP, "cache_values.py")
    with tempfile.TemporaryDirectory() as d:
        port = "6391"
        server = subprocess.Popen(["redis-server", "--port", port, "--save", "", "--appendonly", "no", "--dir", d,
                                   "--logfile", os.path.join(d, "log")])
        try:
            for _ in range(100):
                if subprocess.run(["redis-cli", "-p", port, "ping"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            gen = subprocess.Popen([sys.executable, loader, "500000", "1000"], stdout=subprocess.PIPE)
            subprocess.run(["redis-cli", "-p", port, "--pipe"], stdin=gen.stdout, stdout=subprocess.DEVNULL, check=True)
            gen.wait()
            dump(server.pid, out)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait()


def sort(out):
    """GNU sort's buffer (bench/real-programs/sort.sh's lines) once it has read them all: its
    input is kept open, so it waits for the rest, idle, before sorting."""
    lines = subprocess.run("seq 1 3000000 | awk '{ printf \"%08x %s\\n\", ($1 * 2654435761) % 4294967296, $1 }'",
                           shell=True, capture_output=True, check=True).stdout
    dump_once_fed(["sort", "-S", "600M"], lines, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for NAME.bin and NAME.idx")
    ap.add_argument("--only", default="sqlite,cpython,redis,sort")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.only.split(","):
        {"sqlite": sqlite, "cpython": cpython, "redis": redis, "sort": sort}[name](os.path.join(a.out, name))


if __name__ == "__main__":
    main()
