"""The power-cut simulator (``crashsim``) must itself keep what a real disk keeps: a sync
lands held writes in the order they were made, and reads see them all the while.

A CI run of ``test_random_power_cuts_two_putters`` lost four blocks acknowledged durable:
a slot written twice before one sync (a raced put's copy of a key, then the block of the
put that reused the freed slot) was landed as one io_uring batch, whose requests complete
in any order, and the older copy won. The inner backend here completes a batch's writes
in reverse order (as legal as any other), so what io_uring did now and then happens every
time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.slot_io import IORequest
from storage_nodes.ssd.io_backend import PreadBackend
from storage_nodes.testing.ssd_backends import CrashSimBackend

PAGE = 4096
SLOTS = 4


class ReversedPread(PreadBackend):
    """Completes a batch's writes last to first."""

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        return super().write_batch(list(reqs)[::-1])[::-1]


class GatedPread(ReversedPread):
    """Holds every write batch until ``go`` is set, saying ``landing`` meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.landing, self.go = threading.Event(), threading.Event()

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        self.landing.set()
        assert self.go.wait(30)
        return super().write_batch(reqs)


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "slab", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, SLOTS * PAGE)
    yield fd
    os.close(fd)


def page(fill: int) -> memoryview:
    return memoryview(bytearray([fill]) * PAGE)


def write(sim: CrashSimBackend, fd: int, slot: int, fill: int) -> None:
    assert sim.write_batch([IORequest(fd, slot * PAGE, page(fill))]) == [PAGE]


def on_file(fd: int, slot: int) -> int:
    data = os.pread(fd, PAGE, slot * PAGE)
    assert data == bytes([data[0]]) * PAGE, "a torn slot"
    return data[0]


def read(sim: CrashSimBackend, fd: int, slot: int) -> int:
    buf = bytearray(PAGE)
    assert sim.read_batch([IORequest(fd, slot * PAGE, memoryview(buf))]) == [PAGE]
    return buf[0]


def test_a_sync_leaves_the_later_of_two_writes_to_a_slot(fd: int) -> None:
    sim = CrashSimBackend(ReversedPread())
    write(sim, fd, 1, 0xAA)  # a raced put's copy: its slot is freed and reused
    write(sim, fd, 1, 0xBB)  # the block of the put that reused it
    assert sim.sync([fd]) == [0]
    assert on_file(fd, 1) == 0xBB


def test_a_cut_keeping_both_writes_leaves_the_later_one(fd: int) -> None:
    sim = CrashSimBackend(ReversedPread())
    write(sim, fd, 2, 0xAA)
    write(sim, fd, 2, 0xBB)
    sim.crash(keep_fraction=1.0)
    assert on_file(fd, 2) == 0xBB
    assert sim.dropped_writes == 0


def test_reads_see_the_writes_a_sync_is_landing(fd: int) -> None:
    inner = GatedPread()
    sim = CrashSimBackend(inner)
    write(sim, fd, 0, 0xCC)
    syncing = threading.Thread(target=sim.sync, args=([fd],))
    syncing.start()
    try:
        assert inner.landing.wait(30)
        assert on_file(fd, 0) == 0  # taken from the held writes, not on the file yet
        assert read(sim, fd, 0) == 0xCC
    finally:
        inner.go.set()
        syncing.join()
    assert on_file(fd, 0) == read(sim, fd, 0) == 0xCC


def test_a_cut_waits_for_the_sync_under_way(fd: int) -> None:
    """The power goes after a sync that already took its writes: they land whole, and
    nothing written after the cut does."""
    inner = GatedPread()
    sim = CrashSimBackend(inner)
    write(sim, fd, 0, 0xDD)
    syncing = threading.Thread(target=sim.sync, args=([fd],))
    syncing.start()
    assert inner.landing.wait(30)
    cut = threading.Thread(target=sim.crash)
    cut.start()
    try:
        cut.join(0.2)
        assert cut.is_alive(), "the cut did not wait for the landing sync"
    finally:
        inner.go.set()
        syncing.join()
        cut.join()
    assert on_file(fd, 0) == 0xDD
    assert sim.write_batch([IORequest(fd, 0, page(0xEE))]) == [-5]  # EIO after the cut


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, SLOTS - 1), st.integers(1, 255)), max_size=24),
    st.integers(0, 24),
)
def test_the_file_after_a_sync_is_the_writes_applied_in_order(
    tmp_path_factory: pytest.TempPathFactory, writes: list[tuple[int, int]], sync_after: int
) -> None:
    """Any run of slot writes with a sync somewhere in it (and one at the end): reads
    always see the last write of each slot, and so does the file after each sync."""
    path = tmp_path_factory.mktemp("sim") / "slab"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, SLOTS * PAGE)
        sim = CrashSimBackend(ReversedPread())
        want = [0] * SLOTS
        for n, (slot, fill) in enumerate(writes):
            if n == sync_after:
                assert sim.sync([fd]) == [0]
                assert [on_file(fd, s) for s in range(SLOTS)] == want
            write(sim, fd, slot, fill)
            want[slot] = fill
            assert [read(sim, fd, s) for s in range(SLOTS)] == want
        assert sim.sync([fd]) == [0]
        assert [on_file(fd, s) for s in range(SLOTS)] == want
    finally:
        os.close(fd)
