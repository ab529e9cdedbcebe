"""Threads hammering one tier — writers forcing evictions and slab hand-overs between
two size classes, readers verifying every byte, touches, sweeps — never see wrong data,
never report false corruption, and leave a consistent index."""

from __future__ import annotations

import random
import threading

from tests.storage_nodes.ssd.helpers import SLAB, chain, rows, small_ns, verify_all


def test_threads_with_eviction_and_handover(open_tier, clock) -> None:
    small, big = small_ns(), small_ns(model_id="big", head_dim=32)  # 4 KiB and 12 KiB slots
    t = open_tier(capacity_bytes=3 * SLAB, retention_s=3600.0, touch_batch_max=16)
    t.register(small)
    t.register(big)
    chains = {ns: [chain(ns, 10, salt=s) for s in range(12)] for ns in (small, big)}
    errors: list[str] = []
    stop = threading.Event()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(60):
            ns = rnd.choice((small, big))
            keys = rnd.choice(chains[ns])
            t.put(ns, keys, rows(ns, keys))

    def reader(seed: int) -> None:
        rnd = random.Random(seed)
        while not stop.is_set():
            ns = rnd.choice((small, big))
            keys = rnd.choice(chains[ns])
            dst = bytearray(len(keys) * ns.block_bytes)
            h = t.get_into(ns, keys, dst)
            if bytes(dst[: h * ns.block_bytes]) != rows(ns, keys[:h]):
                errors.append("wrong bytes")
            t.touch(ns, keys[: rnd.randint(0, 10)])

    def janitor() -> None:
        while not stop.is_set():
            t.sweep()
            t.flush_touches()
            t.stats()

    writers = [threading.Thread(target=writer, args=(s,)) for s in range(2)]
    others = [threading.Thread(target=reader, args=(s,)) for s in range(10, 12)]
    others.append(threading.Thread(target=janitor))
    for th in writers + others:
        th.start()
    for th in writers:
        th.join()
    stop.set()
    for th in others:
        th.join()
    assert errors == []
    cnt = t.stats().counters
    assert cnt["corrupt_blocks_total"] == 0 and cnt["degraded"] == 0
    assert cnt["evictions"] > 0 and cnt["slab_handovers"] > 0, cnt
    t.check_integrity()
    verify_all(t, small)
    verify_all(t, big)
