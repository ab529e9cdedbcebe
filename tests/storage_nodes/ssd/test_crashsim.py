"""Crash safety (b): the crashsim backend drops every write not followed by a sync.

A seeded random workload runs on a real directory through ``crashsim``; at a random
crash point (or between operations) the power is cut: unsynced writes vanish (or a
random subset survives, in any order). After reopening, every indexed key must read
back exactly and ``check_integrity`` must pass; every put acknowledged before the
crash must still be there unless capacity evicted it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from storage_nodes.ssd import CRASH_POINTS, SimulatedCrash, SSDTier
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    FakeClock,
    chain,
    make_config,
    rows,
    small_ns,
    verify_all,
)


class RandomCut:
    def __init__(self, rng: random.Random, p: float) -> None:
        self.rng, self.p = rng, p
        self.tier: SSDTier | None = None
        self.keep = 0.0

    def __call__(self, point: str) -> None:
        if self.tier is not None and self.rng.random() < self.p:
            self.tier.io_backend.crash(keep_fraction=self.keep, seed=self.rng.randrange(1 << 30))
            raise SimulatedCrash(point)


def _workload(t: SSDTier, rng: random.Random, acked: set[bytes], steps: int) -> None:
    ns = small_ns()
    for _ in range(steps):
        op = rng.random()
        keys = chain(ns, rng.randint(1, 24), salt=rng.randrange(12))
        if op < 0.6:
            r = t.put(ns, keys, rows(ns, keys))
            if r.inserted + r.present == len(keys):  # acknowledged as stored
                acked.update(keys)
        elif op < 0.8:
            t.touch(ns, keys)
        else:
            dst = bytearray(len(keys) * ns.block_bytes)
            h = t.get_into(ns, keys, dst)
            assert bytes(dst[: h * ns.block_bytes]) == rows(ns, keys[:h])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("keep", [0.0, 0.5])
def test_random_power_cuts(tmp_path: Path, seed: int, keep: float) -> None:
    ns = small_ns()
    rng = random.Random(seed * 7919 + int(keep * 10))
    cap = rng.choice([2, 8]) * SLAB  # 2 slabs: evictions all the time; 8: none
    clock = FakeClock()
    d = tmp_path / "ssd"
    acked: set[bytes] = set()
    for _round in range(3):
        cut = RandomCut(rng, p=0.15)
        cut.keep = keep
        t = SSDTier(
            make_config(d, io_backend="crashsim", capacity_bytes=cap, crash_hook=cut, clock=clock)
        )
        t.register(ns)
        cut.tier = t
        try:
            _workload(t, rng, acked, steps=40)
            t.io_backend.crash(keep_fraction=keep, seed=seed)  # cut between operations
        except SimulatedCrash:
            pass
        t.abandon()
        t = SSDTier(make_config(d, io_backend="pread", capacity_bytes=cap, clock=clock))
        t.register(ns)
        t.check_integrity()
        verify_all(t, ns)
        assert t.stats().counters["corrupt_blocks_total"] == 0
        if cap == 8 * SLAB:  # 12 salts x 24 blocks always fit: nothing acked may be lost
            assert acked <= set(t.iter_keys(ns))
        t.close()


def test_crashsim_really_drops_unsynced_writes(tmp_path: Path) -> None:
    """Guard the guard: data written but not synced must be gone after the cut."""
    ns = small_ns()
    d = tmp_path / "ssd"
    box: list[SSDTier] = []

    def hook(point: str) -> None:
        if point == "before_data_sync" and box:
            box[0].io_backend.crash()
            raise SimulatedCrash(point)

    t = SSDTier(make_config(d, io_backend="crashsim", crash_hook=hook))
    t.register(ns)
    box.append(t)
    k = chain(ns, 4)
    with pytest.raises(SimulatedCrash):
        t.put(ns, k, rows(ns, k))
    assert t.io_backend.dropped_writes == 4
    t.abandon()
    raw = b"".join(p.read_bytes() for p in sorted((d / "slabs").glob("slab-*")))
    assert rows(ns, k)[: ns.block_bytes] not in raw


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_each_point_with_dropped_writes(tmp_path: Path, point: str) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    box: list[SSDTier] = []

    def hook(p: str) -> None:
        if p == point and box:
            box[0].io_backend.crash()
            raise SimulatedCrash(p)

    t = SSDTier(make_config(d, io_backend="crashsim", capacity_bytes=2 * SLAB, crash_hook=hook))
    t.register(ns)
    a = chain(ns, 128, salt=1)
    t.put(ns, a, rows(ns, a))
    box.append(t)
    b = chain(ns, 8, salt=2)
    with pytest.raises(SimulatedCrash):
        t.put(ns, b, rows(ns, b))
    t.abandon()
    t = SSDTier(make_config(d, io_backend="pread", capacity_bytes=2 * SLAB))
    t.register(ns)
    t.check_integrity()
    assert verify_all(t, ns) >= 120
    assert t.contains(ns, b) == 0
    t.close()
