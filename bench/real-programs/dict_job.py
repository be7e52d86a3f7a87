"""A CPython job: builds a dict of 1M records (about 370 MiB), then probes 100k random
keys and sums a field. Deterministic output."""
import random

records = {}
for i in range(1_000_000):
    records[i] = ("record-%d" % i, i * 3, [i, i + 1])
rng = random.Random(42)
total = 0
for _ in range(100_000):
    total += records[rng.randrange(1_000_000)][1]
print(len(records), total)
