#!/usr/bin/env python3
"""A numpy workload over data larger than a memory budget, under uswap or plain.

Two workloads:

* ``matmul``: a blocked matrix product C = A @ B of n x n float64 matrices (3 n^2 * 8 bytes
  in all), tile by tile, so each step reads a row panel of A and a column panel of B;
* ``gather``: random reads (80 % of them in a hot 20 % of the array, as ``uswap bench``'s
  80/20 pattern) of a float64 array, in batches, summed.

``--mode uswap`` runs it under ``pager.numpy()`` with ``--limit``; ``--mode plain`` runs the
same code with numpy's own allocator, for a memory cgroup with the kernel's swap (zram) and
the same limit, e.g.::

    systemd-run --scope -p MemoryMax=2G -p MemorySwapMax=infinity \\
        python3 numpy_bench.py --mode plain --workload matmul --size 8GiB

Prints one JSON line: the workload, mode, sizes, seconds, a checksum (equal across modes for
the same arguments) and, under uswap, the pager's counters.
"""

import argparse
import json
import sys
import time

import numpy as np

UNITS = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}


def parse_size(s):
    """'8GiB', '512MiB', '4096': the sizes uswap takes."""
    num = s.rstrip("KMGiBkmgib")
    unit = s[len(num) :]
    if unit not in UNITS:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (e.g. 512MiB, 8GiB)")
    return int(float(num) * UNITS[unit])


def matmul(size_bytes, tile, rng):
    """C = A @ B by tiles; A, B and C together take size_bytes."""
    n = int((size_bytes / 3 / 8) ** 0.5) // tile * tile
    a = np.empty((n, n))
    b = np.empty((n, n))
    for i in range(0, n, tile):  # filled by row panels, so the fill itself stays in budget
        a[i : i + tile] = rng.standard_normal((tile, n))
        b[i : i + tile] = rng.standard_normal((tile, n))
    c = np.zeros((n, n))
    t = time.perf_counter()
    for i in range(0, n, tile):
        for j in range(0, n, tile):
            acc = np.zeros((tile, tile))
            for k in range(0, n, tile):
                acc += a[i : i + tile, k : k + tile] @ b[k : k + tile, j : j + tile]
            c[i : i + tile, j : j + tile] = acc
    seconds = time.perf_counter() - t
    checksum = float(c.sum())
    return {"n": n, "tile": tile, "seconds": seconds, "gflops": 2 * n**3 / seconds / 1e9, "checksum": checksum}


def gather(size_bytes, accesses, batch, rng):
    """Sums `accesses` random elements, 80 % of them from the first 20 % of the array."""
    n = size_bytes // 8
    x = np.empty(n)
    step = 1 << 20
    for i in range(0, n, step):
        x[i : i + step] = np.arange(i, min(i + step, n), dtype=np.float64) * 0.5
    hot = max(n // 5, 1)
    total = 0.0
    t = time.perf_counter()
    for done in range(0, accesses, batch):
        m = min(batch, accesses - done)
        in_hot = rng.random(m) < 0.8
        idx = np.where(in_hot, rng.integers(0, hot, m), rng.integers(0, n, m))
        total += float(x[idx].sum())
    seconds = time.perf_counter() - t
    return {"elements": n, "accesses": accesses, "seconds": seconds, "accesses_per_s": accesses / seconds, "checksum": total}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["uswap", "plain"], default="uswap")
    ap.add_argument("--workload", choices=["matmul", "gather"], default="matmul")
    ap.add_argument("--size", type=parse_size, default=parse_size("256MiB"), help="bytes of data (default 256MiB)")
    ap.add_argument("--limit", default="64MiB", help="uswap's resident limit (default 64MiB)")
    ap.add_argument("--devices", default="zpool", help="uswap's device list (default zpool)")
    ap.add_argument("--fault-mode", choices=["thread", "signal"], default="thread")
    ap.add_argument("--tile", type=int, default=512, help="matmul tile side (default 512)")
    ap.add_argument("--accesses", type=int, default=1_000_000, help="gather: reads (default 1e6)")
    ap.add_argument("--batch", type=int, default=65536, help="gather: reads per numpy call")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--checksum-only",
        action="store_true",
        help="print only the checksum on stdout and the JSON line on stderr (for `uswap bench --command`, "
        "which requires the same stdout under every engine)",
    )
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    run = {
        "matmul": lambda: matmul(args.size, args.tile, rng),
        "gather": lambda: gather(args.size, args.accesses, args.batch, rng),
    }[args.workload]
    out = {"workload": args.workload, "mode": args.mode, "size_bytes": args.size}
    if args.mode == "uswap":
        import uswap

        pager = uswap.Pager(limit=args.limit, devices=args.devices, fault_mode=args.fault_mode)
        with pager.numpy():
            out.update(run())
        st = pager.stats()
        out["limit_bytes"] = pager.limit
        out["counters"] = {k: st[k] for k in ("pgfault", "pgmajfault", "pswpin", "pswpout", "swpout_zero", "resident_peak_pages", "numpy_allocs", "numpy_fallbacks")}
        out["fault_latency_us"] = st["fault_latency_us"]
    else:
        out.update(run())
    if args.checksum_only:
        print(f"checksum {out['checksum']!r}")
        json.dump(out, sys.stderr)
        print(file=sys.stderr)
    else:
        json.dump(out, sys.stdout)
        print()


if __name__ == "__main__":
    main()
