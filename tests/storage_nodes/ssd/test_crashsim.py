"""Crash safety (b): power cuts of the whole directory — slab writes and the index's own
writes (``powercut.PowerCut``) — in both index durability modes and both data-sync modes.

A seeded random workload runs on a real directory; at a random crash point (or between
operations) the power is cut: unsynced slab writes vanish (or a random subset lands),
the index file keeps its last durable state plus a random subset of the pages written
since. The directory is reopened as after a reboot (another ``boot_id``): the fast mode
rebuilds its index from the slot headers, the strict mode trusts its synced index. Then
every indexed key must read back exactly, ``check_integrity`` must pass, nothing may be
counted corrupt, and (with a capacity that never evicts) every put that was durable when
the power went must still be there: with a per-put data sync, every acknowledged put;
in the default mode, where the data is synced behind the puts, every put acknowledged
before the start of a sync round that completed before the cut.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import lmdb
import pytest

from kvstore.keys import Namespace
from storage_nodes.ssd import CRASH_POINTS, SSDTier
from storage_nodes.ssd.config import slot_bytes_for
from storage_nodes.testing.crash import SimulatedCrash, abandon
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    FakeClock,
    aligned,
    chain,
    make_config,
    paged_ns,
    rows,
    small_ns,
    verify_all,
)
from tests.storage_nodes.ssd.powercut import PowerCut

#: (index durability, data sync): the default, the per-put data sync, strict (always per put)
MODES = [("fast", "behind"), ("fast", "per_put"), ("strict", "per_put")]


class Acks(set[bytes]):
    """Keys acknowledged as stored before the power went: a put that returns after the
    cut (on a thread that ran on) was acknowledged to no one. ``durable``: those a
    completed data sync round covered — acknowledged before the round began (the
    syncer takes its slabs after its ``before_data_sync`` point; one syncer thread, so
    rounds never overlap)."""

    power: PowerCut | None = None

    def __init__(self) -> None:
        super().__init__()
        self.durable: set[bytes] = set()
        self._round: set[bytes] = set()

    def update(self, *keys) -> None:  # type: ignore[no-untyped-def, override]
        if self.power is None or not self.power.is_cut:
            super().update(*keys)

    def at(self, point: str) -> None:
        """A crash hook, called before the random cut may strike at ``point``."""
        if point == "before_data_sync":
            self._round = set(self)
        elif point == "after_data_sync" and self.power is not None and not self.power.is_cut:
            self.durable |= self._round


class RandomCut:
    def __init__(self, rng: random.Random, p: float, keep: float) -> None:
        self.rng, self.p, self.keep = rng, p, keep
        self.power: PowerCut | None = None

    def __call__(self, point: str) -> None:
        power = self.power
        if power is not None and power.tier is not None and self.rng.random() < self.p:
            power.cut(keep_fraction=self.keep, seed=self.rng.randrange(1 << 30))
            raise SimulatedCrash(point)


def _workload(t: SSDTier, ns: Namespace, rng: random.Random, acked: set[bytes], steps: int) -> None:
    """With ``paged_ns`` the rows are page aligned: puts and gets move them zero-copy."""
    zero_copy = ns == paged_ns()
    for _ in range(steps):
        op = rng.random()
        keys = chain(ns, rng.randint(1, 24), salt=rng.randrange(12))
        if op < 0.55:
            src = rows(ns, keys)
            r = t.put(ns, keys, aligned(src) if zero_copy else src)
            if r.inserted + r.present == len(keys):  # acknowledged as stored
                acked.update(keys)
        elif op < 0.75:
            t.touch(ns, keys)
            if rng.random() < 0.3:
                t.flush_touches()
        elif op < 0.97:
            n = len(keys) * ns.block_bytes
            dst = aligned(n) if zero_copy else bytearray(n)
            h = t.get_into(ns, keys, dst)
            assert bytes(dst[: h * ns.block_bytes]) == rows(ns, keys[:h])
        else:
            t.sweep()


@pytest.mark.parametrize(("mode", "data_sync"), MODES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keep", [0.0, 0.5])
def test_random_power_cuts(
    tmp_path: Path, mode: str, data_sync: str, seed: int, keep: float
) -> None:
    _power_cuts(tmp_path, small_ns(), mode, data_sync, seed, keep)


@pytest.mark.parametrize(("mode", "data_sync"), MODES)
@pytest.mark.parametrize("seed", range(3))
def test_random_power_cuts_zero_copy(tmp_path: Path, mode: str, data_sync: str, seed: int) -> None:
    """The same with 8 KiB blocks in page-aligned rows: header pages from staging and
    payloads straight from (and into) the caller's rows."""
    _power_cuts(tmp_path, paged_ns(), mode, data_sync, seed, 0.5)


@pytest.mark.parametrize(("mode", "data_sync"), MODES)
@pytest.mark.parametrize("seed", range(4))
def test_random_power_cuts_two_putters(
    tmp_path: Path, mode: str, data_sync: str, seed: int
) -> None:
    """The same with a second thread putting all along, so group commits overlap (one's
    reservation and writes while the other's writes, sync or publish are in flight) when
    the power goes; the cut comes from whichever thread reaches the crash point."""
    _power_cuts(tmp_path, small_ns(), mode, data_sync, seed + 100, 0.5, putters=2)


def _putter(t: SSDTier, ns: Namespace, seed: int, acked: set[bytes], stop: threading.Event) -> None:
    """Puts until ``stop`` (or until this thread's crash point cuts the power)."""
    rng = random.Random(seed)
    try:
        while not stop.is_set():
            keys = chain(ns, rng.randint(1, 24), salt=rng.randrange(12))
            r = t.put(ns, keys, rows(ns, keys))
            if r.inserted + r.present == len(keys):
                acked.update(keys)
    except SimulatedCrash:
        pass


def _power_cuts(
    tmp_path: Path,
    ns: Namespace,
    mode: str,
    data_sync: str,
    seed: int,
    keep: float,
    putters: int = 1,
) -> None:
    rng = random.Random(seed * 7919 + int(keep * 10) + (mode == "strict"))
    # 2 slabs: evictions all the time; 8 (24 for 12 KiB slots): none
    per_slot = slot_bytes_for(ns.block_bytes) // 4096
    cap = rng.choice([2, 8 * per_slot]) * SLAB
    clock = FakeClock()
    d = tmp_path / "ssd"
    acked = Acks()
    rebuilt = 0
    for boot in ("1", "2", "3"):
        cut = RandomCut(rng, p=0.12, keep=keep)

        def hook(point: str, cut: RandomCut = cut) -> None:
            acked.at(point)
            cut(point)

        power = PowerCut(d, then=hook)
        cut.power = acked.power = power
        cfg = dict(capacity_bytes=cap, clock=clock, index_durability=mode, data_sync=data_sync)
        t = SSDTier(
            make_config(
                d, io_backend="crashsim", crash_hook=power.hook, boot_id=f"b{boot}".strip, **cfg
            )
        )
        rebuilt += t.rebuild_report is not None
        t.register(ns)
        power.tier = t
        stop = threading.Event()
        others = [
            threading.Thread(target=_putter, args=(t, ns, rng.randrange(1 << 30), acked, stop))
            for _ in range(putters - 1)
        ]
        for th in others:
            th.start()
        try:
            _workload(t, ns, rng, acked, steps=40)
            power.cut(keep_fraction=keep, seed=seed)  # cut between operations
        except SimulatedCrash:
            pass
        finally:
            stop.set()
            for th in others:
                th.join()
        power.settle()
        t = SSDTier(make_config(d, io_backend="pread", boot_id=f"r{boot}".strip, **cfg))
        assert (t.rebuild_report is not None) == (mode == "fast")
        t.register(ns)
        t.check_integrity()
        verify_all(t, ns)
        assert t.stats().counters["corrupt_blocks_total"] == 0
        if cap > 2 * SLAB:  # 12 salts x 24 blocks always fit: nothing durable may be lost
            assert (acked if t.config.sync_per_put else acked.durable) <= set(t.iter_keys(ns))
        # What the cut lost is acknowledged to no one now; the clean close below makes
        # the rest durable.
        acked.intersection_update(t.iter_keys(ns))
        acked.durable = set(acked)
        t.close()  # a clean close: the next open trusts the index
    assert rebuilt == 0  # clean closes are never rebuilt


def test_crashsim_really_drops_unsynced_writes(tmp_path: Path) -> None:
    """Guard the guard: data written but not synced must be gone after the cut. (In the
    default mode the put returns with its data unsynced; the cut comes in the syncer.)"""
    ns = small_ns()
    d = tmp_path / "ssd"
    box: list[SSDTier] = []

    def hook(point: str) -> None:
        if point == "before_data_sync" and box:
            box[0].io_backend.crash()  # type: ignore[attr-defined]
            raise SimulatedCrash(point)

    t = SSDTier(make_config(d, io_backend="crashsim", crash_hook=hook))
    t.register(ns)
    box.append(t)
    k = chain(ns, 4)
    assert t.put(ns, k, rows(ns, k)).inserted == 4
    assert not t.sync()  # its round crashed
    assert t.io_backend.dropped_writes == 4  # type: ignore[attr-defined]
    abandon(t)
    raw = b"".join(p.read_bytes() for p in sorted((d / "slabs").glob("slab-*")))
    assert rows(ns, k)[: ns.block_bytes] not in raw


def test_powercut_really_drops_unsynced_index_pages(tmp_path: Path) -> None:
    """Guard the guard: in fast mode the index is not synced per put, so a cut with
    nothing kept leaves the index as it was at open — the keys are gone from it, and only
    the rebuild from the slot headers brings them back."""
    ns = small_ns()
    d = tmp_path / "ssd"
    power = PowerCut(d)
    t = SSDTier(make_config(d, io_backend="crashsim", crash_hook=power.hook, boot_id=lambda: "1"))
    t.register(ns)
    power.tier = t
    k = chain(ns, 6)
    assert t.put(ns, k, rows(ns, k)).inserted == 6
    assert t.sync()  # the data, not the index
    power.cut(keep_fraction=0.0)
    power.settle()
    env = lmdb.open(str(d / "index"), readonly=True, lock=False, max_dbs=8)
    with env.begin() as txn:  # what the cut left of the index: the state at open
        assert txn.stat(env.open_db(b"keys", txn=txn, create=False))["entries"] == 0
    env.close()
    t = SSDTier(make_config(d, io_backend="pread", boot_id=lambda: "2"))
    t.register(ns)
    assert t.rebuild_report is not None and t.rebuild_report.blocks == 6
    assert verify_all(t, ns) == 6
    t.check_integrity()
    t.close()


# (blocks of a, blocks of b) after a cut at each point of the put of b (or of the sync
# round behind it), which must evict 8 of a's 128 first. Fast: the index is rebuilt from
# the slot headers, so what counts is which slots were durably overwritten — with a
# per-put sync none before b's data sync (the eviction existed only in the index), b's 8
# once it was synced; with the sync behind the puts, none before the syncer's round
# completed. Strict: the synced index is trusted; the eviction's commit is synced before
# every one of these points (it is the first "index_synced"), and b's publish never is.
EXPECTED = {
    ("fast", "behind", "before_data_sync"): (128, 0),
    ("fast", "behind", "after_data_sync"): (120, 8),
    ("fast", "behind", "inside_index_commit"): (128, 0),
    ("fast", "behind", "after_free"): (128, 0),
    ("fast", "per_put", "before_data_sync"): (128, 0),
    ("fast", "per_put", "after_data_sync"): (120, 8),
    ("fast", "per_put", "inside_index_commit"): (120, 8),
    ("fast", "per_put", "after_free"): (128, 0),
    ("strict", "per_put", "before_data_sync"): (120, 0),
    ("strict", "per_put", "after_data_sync"): (120, 0),
    ("strict", "per_put", "inside_index_commit"): (120, 0),
    ("strict", "per_put", "after_free"): (120, 0),
    ("strict", "per_put", "index_synced"): (120, 0),
}
CASES = [
    (m, ds, p) for m, ds in MODES for p in CRASH_POINTS if m == "strict" or p != "index_synced"
]
SYNC_POINTS = ("before_data_sync", "after_data_sync")


def test_every_case_has_an_expected_outcome() -> None:
    assert sorted(EXPECTED) == sorted(CASES)


@pytest.mark.parametrize(("mode", "data_sync", "point"), CASES)
def test_each_point_with_dropped_writes(
    tmp_path: Path, mode: str, data_sync: str, point: str
) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    armed: list[bool] = []

    def at_point(p: str) -> None:
        if p == point and armed:
            power.cut()
            raise SimulatedCrash(p)

    power = PowerCut(d, then=at_point)
    cfg = dict(capacity_bytes=2 * SLAB, index_durability=mode, data_sync=data_sync)
    t = SSDTier(
        make_config(d, io_backend="crashsim", crash_hook=power.hook, boot_id=lambda: "1", **cfg)
    )
    t.register(ns)
    power.tier = t
    a = chain(ns, 128, salt=1)
    t.put(ns, a, rows(ns, a))
    assert t.sync()  # a is durable and the syncer idle before the hook is armed
    armed.append(True)
    b = chain(ns, 8, salt=2)
    if data_sync == "behind" and point in SYNC_POINTS:
        assert t.put(ns, b, rows(ns, b)).inserted == 8  # no sync inside the put
        assert not t.sync()  # the cut came in the round behind it
    else:
        with pytest.raises(SimulatedCrash):
            t.put(ns, b, rows(ns, b))
    power.settle()
    t = SSDTier(make_config(d, io_backend="pread", boot_id=lambda: "2", **cfg))
    t.register(ns)
    t.check_integrity()
    kept_a, kept_b = EXPECTED[(mode, data_sync, point)]
    assert (t.contains(ns, a), t.contains(ns, b)) == (kept_a, kept_b)
    assert verify_all(t, ns) == kept_a + kept_b
    assert t.stats().counters["corrupt_blocks_total"] == 0
    t.close()


@pytest.mark.parametrize(("mode", "data_sync"), MODES)
def test_a_put_that_lost_the_race_for_its_keys_is_durable_once_synced(
    tmp_path: Path, mode: str, data_sync: str
) -> None:
    """Put A's writes of four keys are held in flight while put B of the same keys looks
    them up (absent), writes and publishes them; A then finds them published (raced) and
    acknowledges them on the strength of B's copy. That acknowledgement is kept: once a
    ``sync`` after A's return completed, a cut dropping every unsynced write leaves them
    readable. (The CI failure first blamed on this race was the simulator's:
    ``tests/storage_nodes/testing/test_ssd_backends.py``.)"""
    ns = small_ns()
    d = tmp_path / "ssd"
    power = PowerCut(d)
    cfg = dict(index_durability=mode, data_sync=data_sync)
    t = SSDTier(
        make_config(d, io_backend="crashsim", crash_hook=power.hook, boot_id=lambda: "1", **cfg)
    )
    t.register(ns)
    power.tier = t
    sim, k = t.io_backend, chain(ns, 4)
    in_flight, go = threading.Event(), threading.Event()
    real = sim.write_batch

    def write_batch(reqs):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "A":
            in_flight.set()
            assert go.wait(30)
        return real(reqs)

    sim.write_batch = write_batch  # type: ignore[method-assign]
    out = {}
    a = threading.Thread(target=lambda: out.update(a=t.put(ns, k, rows(ns, k))), name="A")
    a.start()
    try:
        assert in_flight.wait(30)
        b = t.put(ns, k, rows(ns, k))
    finally:
        go.set()
        a.join()
    assert (b.inserted, out["a"].inserted, out["a"].present) == (4, 0, 4)
    assert t.sync()
    power.cut()
    power.settle()
    t = SSDTier(make_config(d, io_backend="pread", boot_id=lambda: "2", **cfg))
    t.register(ns)
    t.check_integrity()
    assert set(t.iter_keys(ns)) == set(k)
    assert verify_all(t, ns) == 4
    assert t.stats().counters["corrupt_blocks_total"] == 0
    t.close()
