"""sqlite3 (the command-line shell, an unmodified program) with a skewed working set: an
in-memory database of 1M rows of 400 random bytes (about 450 MiB), then for SECONDS
(default 60) range queries of 100 rows, 90 % of them among the first 100k rows and the rest
among the first 500k: the other half of the rows is never read again. The queries go to the
shell's standard input 100 at a time and their answers are read back. Prints the queries
answered and their rate: the rate is what a limit slows.

    /usr/bin/python3 bench/auto-budget/sqlite_skewed.py 90
"""
import random
import subprocess
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
rows = 1_000_000
shell = subprocess.Popen(["sqlite3", ":memory:"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def ask(sql, answers):
    shell.stdin.write(sql)
    shell.stdin.flush()
    return [shell.stdout.readline() for _ in range(answers)]


ask("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);\n"
    f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows}) "
    "INSERT INTO t SELECT x, randomblob(400) FROM c;\n"
    "SELECT count(*) FROM t;\n", 1)
rng = random.Random(42)
n = 0
start = time.monotonic()
while time.monotonic() - start < seconds:
    batch = []
    for _ in range(100):
        k = rng.randrange(100_000) if rng.random() < 0.9 else rng.randrange(500_000)
        batch.append(f"SELECT sum(length(v)) FROM t WHERE id BETWEEN {k + 1} AND {k + 100};\n")
    answers = ask("".join(batch), 100)
    assert all(a.strip() == "40000" for a in answers), answers[:3]
    n += 100
rate = n / (time.monotonic() - start)
shell.stdin.close()
shell.wait()
print(f"queries {n} rate {rate:.0f}/s")
