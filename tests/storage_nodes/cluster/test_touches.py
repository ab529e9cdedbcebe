"""Touch batching: order preserved across batched calls, per namespace, flushed on size."""

from __future__ import annotations

from kvstore.keys import Key, Namespace
from storage_nodes.cluster.touches import TouchBatcher
from tests.conftest import small_ns

A, B = small_ns(), small_ns(model_id="other")


def k(i: int) -> bytes:
    return i.to_bytes(16, "big")


class Recorder:
    def __init__(self, ok: bool = True) -> None:
        self.sent: list[tuple[int, bytes, list[Key]]] = []
        self.ok = ok

    def __call__(self, node: int, ns: Namespace, keys: list[Key]) -> bool:
        self.sent.append((node, ns.fingerprint, keys))
        return self.ok


def apply_last_to_first(keys: list[Key]) -> list[Key]:
    """What a node does: touch the last key first; returns keys oldest → newest."""
    return list(reversed(keys))


def test_batched_calls_keep_the_order_they_happened_in() -> None:
    rec = Recorder()
    b = TouchBatcher(2, rec, flush_s=3600, max_keys=1000)
    b.add(0, A, [k(1), k(2), k(3)])  # first call: k1 newest of it, k3 oldest
    b.add(0, A, [k(4), k(5)])  # second call, later: all of it newer than the first
    b.add(1, A, [k(9)])
    b.flush(0)
    assert len(rec.sent) == 1
    node, fp, keys = rec.sent[0]
    assert (node, fp) == (0, A.fingerprint)
    # Applied last→first, the node ends with recency k3 < k2 < k1 < k5 < k4.
    assert apply_last_to_first(keys) == [k(3), k(2), k(1), k(5), k(4)]
    assert b.pending_keys() == 1
    b.close()
    assert rec.sent[-1] == (1, A.fingerprint, [k(9)])
    assert b.counters["touch_keys"] == 6
    b.check_integrity()


def test_one_touch_per_namespace_and_flush_on_size() -> None:
    rec = Recorder()
    b = TouchBatcher(1, rec, flush_s=3600, max_keys=5)
    b.add(0, A, [k(1)])
    b.add(0, B, [k(2)])
    b.add(0, A, [k(3), k(4)])
    assert rec.sent == [] and b.pending_keys() == 4
    b.add(0, B, [k(5)])  # 5 keys: flushed now
    assert sorted((fp, keys) for _, fp, keys in rec.sent) == sorted(
        [(A.fingerprint, [k(3), k(4), k(1)]), (B.fingerprint, [k(5), k(2)])]
    )
    assert b.pending_keys() == 0
    b.close()


def test_failed_touches_are_counted() -> None:
    b = TouchBatcher(1, Recorder(ok=False), flush_s=3600, max_keys=100)
    b.add(0, A, [k(1), k(2)])
    b.flush_all()
    assert b.counters["touch_failures"] == 2
    b.close()
