#!/bin/bash
# GNU sort with a 600 MiB buffer over 3M generated lines: its buffer is one large anonymous
# mapping. Prints a checksum of the sorted output; fails if any stage fails.
set -euo pipefail
seq 1 3000000 | awk '{ printf "%08x %s\n", ($1 * 2654435761) % 4294967296, $1 }' | sort -S 600M | cksum
