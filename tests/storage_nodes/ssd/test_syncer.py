"""The data sync behind the puts (``syncer.py``, the default ``data_sync="behind"``).

On the ``crashsim`` backend, which holds every write until a sync of its file: a put
returns with its data still held (what a power cut would drop), ``sync()`` makes every
acknowledged put durable, a clean close syncs before it marks the index clean, and a
deadline or a failed round is reported, never hidden. The syncer's round is gated on
its ``before_data_sync`` point, so nothing here depends on timing.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from kvstore.errors import StoreUnavailable
from storage_nodes.ssd import SSDTier
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.errors import SSDConfigError
from storage_nodes.ssd.index import Index
from storage_nodes.ssd.io_backend import PreadBackend
from storage_nodes.ssd.syncer import BehindSync
from tests.storage_nodes.ssd.helpers import chain, make_config, rows, small_ns, verify_all


class Gate:
    """Holds the syncer at the start of each round until ``open``."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.waiting = threading.Event()

    def __call__(self, point: str) -> None:
        if point == "before_data_sync":
            self.waiting.set()
            assert self.go.wait(timeout=60), "the test never opened the gate"


def _tier(d: Path, **kw: object) -> SSDTier:
    t = SSDTier(make_config(d, io_backend="crashsim", **kw))
    t.register(small_ns())
    return t


def test_a_put_returns_before_its_data_is_synced_and_sync_makes_it_durable(
    tmp_path: Path,
) -> None:
    ns, gate = small_ns(), Gate()
    t = _tier(tmp_path / "ssd", crash_hook=gate)
    k = chain(ns, 5)
    assert t.put(ns, k, rows(ns, k)).inserted == 5  # returns while its round is held
    assert gate.waiting.wait(timeout=60)
    held = t.io_backend._held  # type: ignore[attr-defined]
    assert sum(len(w) for w in held.values()) == 5  # a power cut now would drop them
    with pytest.raises(StoreUnavailable):
        t.sync(timeout_s=0.05)  # the round is held: the deadline passes first
    gate.go.set()
    assert t.sync()
    assert not t.io_backend._held  # type: ignore[attr-defined]
    assert t.stats().counters["data_sync_rounds"] == 1
    t.io_backend.crash()  # type: ignore[attr-defined]
    assert t.io_backend.dropped_writes == 0  # type: ignore[attr-defined]
    t.close()


def test_sync_covers_every_put_acknowledged_before_it(tmp_path: Path) -> None:
    """Puts from two threads, then one ``sync``: a power cut after it loses nothing."""
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _tier(d, boot_id=lambda: "1")
    chains = [chain(ns, 6, salt=s) for s in range(8)]

    def put(some: list[list[bytes]]) -> None:
        for k in some:
            assert t.put(ns, k, rows(ns, k)).inserted == len(k)

    others = threading.Thread(target=put, args=(chains[4:],))
    others.start()
    put(chains[:4])
    others.join()
    assert t.sync()
    t.io_backend.crash()  # type: ignore[attr-defined]
    assert t.io_backend.dropped_writes == 0  # type: ignore[attr-defined]
    from storage_nodes.testing.crash import abandon

    abandon(t)
    t = SSDTier(make_config(d, io_backend="pread", boot_id=lambda: "2"))  # a reboot
    t.register(ns)
    assert t.rebuild_report is not None  # no clean close: rebuilt from the slot headers
    assert all(t.contains(ns, k) == 6 for k in chains)
    assert verify_all(t, ns) == 48
    t.close()


def test_a_clean_close_syncs_the_data_before_it_marks_the_index_clean(tmp_path: Path) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _tier(d, boot_id=lambda: "1")
    k = chain(ns, 7)
    assert t.put(ns, k, rows(ns, k)).inserted == 7
    io = t.io_backend
    t.close()
    assert not io._held  # type: ignore[attr-defined]
    t = SSDTier(make_config(d, io_backend="pread", boot_id=lambda: "2"))
    t.register(ns)
    assert t.rebuild_report is None  # the clean marker: the index is trusted as it is
    assert t.contains(ns, k) == 7 and verify_all(t, ns) == 7
    t.close()


def test_per_put_mode_syncs_inside_the_put(tmp_path: Path) -> None:
    ns = small_ns()
    t = _tier(tmp_path / "ssd", data_sync="per_put")
    k = chain(ns, 3)
    assert t.put(ns, k, rows(ns, k)).inserted == 3
    assert not t.io_backend._held  # type: ignore[attr-defined]
    assert t.stats().counters["data_sync_rounds"] == 0  # no syncer thread in this mode
    assert t.stats().info["data_sync"] == "per_put"
    t.close()


def test_config_data_sync_values(tmp_path: Path) -> None:
    assert SSDConfig(dir=tmp_path, capacity_bytes=64 << 20).data_sync == "behind"
    assert not SSDConfig(dir=tmp_path, capacity_bytes=64 << 20).sync_per_put
    # a synced index must never name unsynced data: strict syncs each put's data too
    assert SSDConfig(dir=tmp_path, capacity_bytes=64 << 20, index_durability="strict").sync_per_put
    with pytest.raises(SSDConfigError, match="data_sync must be one of"):
        SSDConfig(dir=tmp_path, capacity_bytes=64 << 20, data_sync="never")
    for bad in (-1, float("nan"), float("inf"), "5ms", True):
        with pytest.raises(SSDConfigError, match="data_sync_interval_s"):
            SSDConfig(dir=tmp_path, capacity_bytes=64 << 20, data_sync_interval_s=bad)


def test_rounds_are_spaced_but_a_waiting_sync_starts_one_at_once(tmp_path: Path) -> None:
    """With rounds at most every 60 s, the second ``sync`` still returns at once: a
    waiter cuts the pause short (a deadline of 30 s fails the test rather than hang)."""
    ns = small_ns()
    t = _tier(tmp_path / "ssd", data_sync_interval_s=60.0)
    for salt in range(3):
        k = chain(ns, 2, salt=salt)
        assert t.put(ns, k, rows(ns, k)).inserted == 2
        assert t.sync(timeout_s=30)
        assert t.stats().counters["data_sync_rounds"] == salt + 1
    assert not t.io_backend._held  # type: ignore[attr-defined]
    t.close()


def test_a_write_noted_with_no_slabs_leaves_nothing_to_wait_for(tmp_path: Path) -> None:
    """``written([])`` must not count: a round starts only for dirty slabs, so a counted
    empty call would hold every later ``sync`` until its deadline."""
    errors: list[BaseException] = []
    sync = BehindSync(make_config(tmp_path), PreadBackend(4), lambda slab: -1, errors.append)
    try:
        sync.written([])
        assert sync.sync(timeout_s=5)
        assert sync.rounds() == 0
        sync.check_integrity()
    finally:
        sync.abandon()
    assert not errors


def test_a_write_wakes_an_idle_syncer_but_not_one_in_its_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put wakes the syncer when it waits for work, so its round starts without a
    ``sync``; in the pause after a round (60 s here) it would only find the pause not
    over, so a put does not wake it (each wake took the GIL from the putting thread)."""
    errors: list[BaseException] = []
    f = tmp_path / "slab"
    f.write_bytes(b"\0" * 4096)
    fd = os.open(f, os.O_RDWR)
    cfg = make_config(tmp_path / "ssd", data_sync_interval_s=60.0)
    sync = BehindSync(cfg, PreadBackend(4), lambda slab: fd, errors.append)
    try:
        sync.written([0])  # the syncer waits for work: woken, it runs a round
        deadline = time.monotonic() + 30
        while sync.rounds() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sync.rounds() == 1
        wakes: list[int] = []
        real = sync._cond.notify_all
        monkeypatch.setattr(sync._cond, "notify_all", lambda: (wakes.append(1), real()))
        for _ in range(5):
            sync.written([0])  # in its pause now
        assert not wakes
        assert sync.sync(timeout_s=30)  # a waiter still cuts the pause short
        assert sync.rounds() == 2
        sync.check_integrity()
    finally:
        sync.abandon()
        os.close(fd)
    assert not errors


def test_a_sync_covers_data_another_put_acknowledged_as_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that finds its keys present acknowledges them on the strength of the put
    that wrote them; a ``sync`` after it must make that data durable. The writing put is
    held right after its publish committed (its keys visible) while a second put finds
    them present and syncs: that ``sync`` may only return once the round covering the
    first put's slabs ran, with nothing a power cut could drop left held. (The slabs
    were noted for the syncer only after the commit, separately: the ``sync`` returned
    True at once, the first put's writes still held.)"""
    ns = small_ns()
    published, go_on = threading.Event(), threading.Event()
    publishing = threading.local()

    def hook(point: str) -> None:
        if point == "inside_index_commit":
            publishing.now = True  # the next commit on this thread is the publish

    t = _tier(tmp_path / "ssd", crash_hook=hook)
    held = t.io_backend._held  # type: ignore[attr-defined]
    real_commit = Index.commit

    def commit(self: Index, txn: object) -> None:
        real_commit(self, txn)  # type: ignore[arg-type]
        if getattr(publishing, "now", False):
            publishing.now = False
            published.set()
            assert go_on.wait(timeout=60), "the test never let the first put go on"

    monkeypatch.setattr(Index, "commit", commit)
    k = chain(ns, 4)
    out: dict[str, object] = {}

    def second() -> None:
        out["present"] = t.put(ns, k, rows(ns, k)).present
        out["synced"] = t.sync(timeout_s=30)
        out["held"] = sum(len(w) for w in held.values())

    first = threading.Thread(target=lambda: t.put(ns, k, rows(ns, k)))
    first.start()
    try:
        assert published.wait(timeout=60)
        other = threading.Thread(target=second)
        other.start()
        other.join(timeout=0.5)  # time enough to return early, as it used to
    finally:
        go_on.set()
        first.join(timeout=60)
    other.join(timeout=60)
    assert out == {"present": 4, "synced": True, "held": 0}
    assert verify_all(t, ns) == 4
    t.close()
