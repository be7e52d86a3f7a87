#!/usr/bin/env python3
"""The values the cache benchmarks load (redis.sh, memcached.sh): N keys `key:%012d` with
values of SIZE bytes, each half random hex (an id, a hash, a token) and half text drawn from
a vocabulary of English words, different for every key. Seeded: every engine, and both
servers, store the same bytes. lz4 gets 1.2-1.3x out of the pages they fill (hex has no
repeats for it to find); a value of one repeated byte would compress to almost nothing and
measure only the fault path.

As a program it writes Redis SET commands (RESP) for `redis-cli --pipe`:

    python3 cache_values.py N SIZE | redis-cli --pipe
"""
import random
import sys

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when if so no will "
         "more out up into do any your what some can could them other than then its about over only "
         "time new these two may first like well also after most very where just our people made "
         "between world because each through long under great such year work back state city house "
         "order account payment customer session request server memory cache record value number").split()


def key(i):
    return "key:%012d" % i


def values(n, size):
    """(key, value) for keys 0..n-1, in order."""
    rng = random.Random(42)
    hex_len = size // 2
    for i in range(n):
        text = []
        left = size - hex_len
        while left > 0:
            w = rng.choice(WORDS)
            text.append(w)
            left -= len(w) + 1
        yield key(i), rng.randbytes((hex_len + 1) // 2).hex()[:hex_len] + " ".join(text)[: size - hex_len]


if __name__ == "__main__":
    out = sys.stdout
    for k, v in values(int(sys.argv[1]), int(sys.argv[2])):
        out.write("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
