"""numpy over an array of MIB mebibytes: fill it, scale it in place, then sum it PASSES times,
and print the sums. Its output depends only on its arguments. Usage: npsum.py MIB PASSES"""
import sys

import numpy as np

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 3
a = np.arange((mib << 20) // 8, dtype=np.int64)
a *= 3
sums = [int(a.sum()) + p for p in range(passes)]
print(f"npsum {mib} MiB, {passes} passes:", *sums)
