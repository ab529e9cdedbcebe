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


def test_a_second_put_reserves_and_writes_before_the_first_publishes(open_tier) -> None:
    """Two group commits overlap: while put A's data is durable but not yet published,
    put B gets through its reservation — an eviction transaction, so it needs LMDB's
    writer lock — and submits its writes. (With A's publishing transaction open across
    its device round, B waited for A's commit and the gate below never opened.) In the
    ``per_put`` data-sync mode, where the sync is the longest step inside a put; the
    default mode's puts do not sync at all (``test_syncer.py``)."""
    a_reserved, b_submitted = threading.Event(), threading.Event()
    events: list[str] = []

    def gate(point: str) -> None:
        me = threading.current_thread().name
        if me == "put-a" and point == "before_data_sync":
            a_reserved.set()
        elif me == "put-a" and point == "after_data_sync":
            opened = b_submitted.wait(timeout=60)  # only a failing run ever waits long
            events.append("a durable, b submitted" if opened else "b held back by a")
        elif me == "put-b" and point == "before_data_sync":
            events.append("b submitted")
            b_submitted.set()

    ns = small_ns()
    t = open_tier(
        capacity_bytes=2 * SLAB, crash_hook=lambda point: gate(point), data_sync="per_put"
    )
    t.register(ns)
    full = chain(ns, 2 * SLAB // 4096, salt=1)  # 4 KiB slots: exactly the capacity
    assert t.put(ns, full, rows(ns, full)).inserted == len(full)

    keys_a, keys_b = chain(ns, 8, salt=2), chain(ns, 8, salt=3)
    results = {}

    def put(name: str, keys: list[bytes]) -> None:
        results[name] = t.put(ns, keys, rows(ns, keys))

    a = threading.Thread(target=put, args=("a", keys_a), name="put-a")
    a.start()
    assert a_reserved.wait(timeout=60)
    b = threading.Thread(target=put, args=("b", keys_b), name="put-b")
    b.start()
    a.join()
    b.join()
    assert events == ["b submitted", "a durable, b submitted"]
    assert results["a"].inserted == 8 and results["b"].inserted == 8
    cnt = t.stats().counters
    assert cnt["evictions"] == 16 and cnt["corrupt_blocks_total"] == 0
    t.check_integrity()
    assert t.contains(ns, keys_a) == 8 and t.contains(ns, keys_b) == 8
    assert verify_all(t, ns) == len(full)
