"""A CPython job with a skewed working set and a cold part: builds a dict of 1M records
(about 370 MiB), then for SECONDS (default 60) looks up keys, 90 % of them among the first
100k and the rest among the first 500k: the other half of the records is never read again.
Prints the lookups done and their rate: the rate is what a limit slows."""
import random
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
records = {}
for i in range(1_000_000):
    records[i] = ("record-%d" % i, i * 3, [i, i + 1])
rng = random.Random(42)
total = n = 0
start = time.monotonic()
while time.monotonic() - start < seconds:
    for _ in range(10_000):
        k = rng.randrange(100_000) if rng.random() < 0.9 else rng.randrange(500_000)
        total += records[k][1]
    n += 10_000
rate = n / (time.monotonic() - start)
print(f"lookups {n} rate {rate:.0f}/s checksum-ok {total > 0}")
