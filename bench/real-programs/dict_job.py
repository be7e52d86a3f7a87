"""A CPython job: builds a dict of 1.5M records (about 570 MiB), then probes 150k random
keys and sums a field. Deterministic output."""
import random

records = {}
for i in range(1_500_000):
    records[i] = ("record-%d" % i, i * 3, [i, i + 1])
rng = random.Random(42)
total = 0
for _ in range(150_000):
    total += records[rng.randrange(1_500_000)][1]
print(len(records), total)
