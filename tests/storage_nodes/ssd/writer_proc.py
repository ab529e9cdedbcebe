"""A writer for the kill -9 test: random puts, touches, reads and sweeps until killed.

Usage: python -m tests.storage_nodes.ssd.writer_proc DIR SEED BACKEND CAPACITY_BYTES ACKED_FILE
LAYOUT PUTTERS. ``paged`` layout: 8 KiB blocks in page-aligned rows (zero-copy puts and
gets; ``packed``: 2 KiB blocks). ``PUTTERS`` 2: a second thread puts all along, so group
commits overlap when the kill comes.
Prints ``ready`` once the tier is open. Appends the hex keys of every fully stored put
to ACKED_FILE after ``put`` returns. Exits 3 if a read ever returns wrong bytes.
"""

from __future__ import annotations

import os
import random
import sys
import threading

from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import aligned, chain, make_config, paged_ns, rows, small_ns


def main() -> int:
    d, seed, backend, cap, acked_path, layout, putters = sys.argv[1:8]
    rng = random.Random(int(seed))
    zero_copy = layout == "paged"
    ns = paged_ns() if zero_copy else small_ns()
    t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=int(cap), touch_flush_s=0.01))
    t.register(ns)
    acked = os.open(acked_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def put(r: random.Random) -> None:
        keys = chain(ns, r.randint(1, 32), salt=r.randrange(16))
        src = rows(ns, keys)
        res = t.put(ns, keys, aligned(src) if zero_copy else src)
        if res.inserted + res.present == len(keys):  # one O_APPEND write: never torn
            os.write(acked, ("".join(k.hex() + "\n" for k in keys)).encode())

    def putter(r: random.Random) -> None:
        while True:
            put(r)

    for _ in range(int(putters) - 1):
        threading.Thread(target=putter, args=(random.Random(rng.random()),), daemon=True).start()
    print("ready", flush=True)
    while True:
        op = rng.random()
        if op < 0.55:
            put(rng)
            continue
        keys = chain(ns, rng.randint(1, 32), salt=rng.randrange(16))
        if op < 0.75:
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
