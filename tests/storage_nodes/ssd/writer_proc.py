"""A writer for the kill -9 test: random puts, touches, reads and sweeps until killed.

Usage: python -m tests.storage_nodes.ssd.writer_proc DIR SEED BACKEND CAPACITY_BYTES ACKED_FILE
[paged]. ``paged``: 8 KiB blocks in page-aligned rows (zero-copy puts and gets).
Prints ``ready`` once the tier is open. Appends the hex keys of every fully stored put
to ACKED_FILE after ``put`` returns. Exits 3 if a read ever returns wrong bytes.
"""

from __future__ import annotations

import os
import random
import sys

from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import aligned, chain, make_config, paged_ns, rows, small_ns


def main() -> int:
    d, seed, backend, cap, acked_path = sys.argv[1:6]
    rng = random.Random(int(seed))
    zero_copy = sys.argv[6:] == ["paged"]
    ns = paged_ns() if zero_copy else small_ns()
    t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=int(cap), touch_flush_s=0.01))
    t.register(ns)
    acked = os.open(acked_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)
    while True:
        op = rng.random()
        keys = chain(ns, rng.randint(1, 32), salt=rng.randrange(16))
        if op < 0.55:
            src = rows(ns, keys)
            r = t.put(ns, keys, aligned(src) if zero_copy else src)
            if r.inserted + r.present == len(keys):
                os.write(acked, ("".join(k.hex() + "\n" for k in keys)).encode())
        elif op < 0.75:
            t.touch(ns, keys)
            t.flush_touches()
        elif op < 0.97:
            n = len(keys) * ns.block_bytes
            dst = aligned(n) if zero_copy else bytearray(n)
            h = t.get_into(ns, keys, dst)
            if bytes(dst[: h * ns.block_bytes]) != rows(ns, keys[:h]):
                return 3
        else:
            t.sweep()


if __name__ == "__main__":
    sys.exit(main())
