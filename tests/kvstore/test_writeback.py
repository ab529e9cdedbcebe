"""Acknowledgements tell the truth (issue 14, item 1): the tier manager over the real SSD
engine in a temporary directory, healthy and failing (read-only, off, raising).

A commit is acknowledged at ``durability="ssd"`` only once the SSD accepted every block it
stored; ``flush`` raises ``NotDurable`` naming how many blocks the SSD refused; the
counters say the same.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.buffers import buffer_address, byte_view
from kvstore.dram import DramConfig, DramTier
from kvstore.errors import NotDurable
from kvstore.keys import chain_keys
from kvstore.manager import ManagerConfig, TierManager
from kvstore.writeback_thread import ThreadWriteBack
from storage_nodes.ssd import SSDTier
from tests.conftest import payload_for, small_ns
from tests.storage_nodes.ssd.helpers import make_config

NS = small_ns()
BB = NS.block_bytes
Opened = Callable[..., tuple[TierManager, SSDTier]]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Opened]:
    """``store(**ssd_config)``: DRAM (32 blocks) over a real SSD engine; closed at the end."""
    made: list[TierManager] = []

    def make(batch_blocks: int = 32, **kw: Any) -> tuple[TierManager, SSDTier]:
        kw.setdefault("io_backend", "faulty")
        ssd = SSDTier(make_config(tmp_path / f"ssd{len(made)}", **kw))
        top = DramTier(DramConfig(32 * BB, chunk_bytes=8 * BB))
        config = ManagerConfig(max_dirty_bytes=16 * BB, writeback_batch_blocks=batch_blocks)
        m = TierManager([top, ssd], config)
        m.register(NS)
        made.append(m)
        return m, ssd

    yield make
    for m in made:
        m.close()


def chain(n: int, seed: int) -> list[bytes]:
    return chain_keys(NS, np.random.default_rng(seed).integers(0, 1 << 20, n * NS.block_tokens))


def pl(keys: list[bytes]) -> dict[int, bytes]:
    return {i: payload_for(NS, k) for i, k in enumerate(keys)}


def read_only(ssd: SSDTier) -> None:
    """A full disk: the engine degrades itself to read-only on the next write."""
    ssd.io_backend.write_errno = errno.ENOSPC  # type: ignore[attr-defined]


def test_healthy_ssd_acknowledges_ssd_and_flush_succeeds(store: Opened) -> None:
    m, ssd = store()
    keys = chain(6, seed=1)
    assert m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10).durability == "ssd"
    assert ssd.contains(NS, keys) == 6
    more = chain(4, seed=2)
    m.commit(NS, more, pl(more))
    m.flush(timeout_s=10)
    assert ssd.contains(NS, more) == 4
    c = m.stats().counters
    assert c["writeback_refused_total"] == 0 and c["commit_not_durable_total"] == 0


def test_read_only_ssd_is_never_acknowledged(store: Opened) -> None:
    m, ssd = store()
    read_only(ssd)
    keys = chain(5, seed=3)
    res = m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    assert (res.inserted, res.durability) == (5, "dram")
    assert ssd.mode == "read-only" and ssd.contains(NS, keys) == 0
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=10)
    assert e.value.refused_blocks == 5
    m.flush(timeout_s=10)  # reported once: nothing new was refused since
    later = chain(3, seed=4)
    m.commit(NS, later, pl(later))  # durability="dram": truthfully acknowledged at once
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=10)
    assert e.value.refused_blocks == 3
    c = m.stats().counters
    assert c["writeback_refused_total"] == 8
    assert c["commit_not_durable_total"] == 1 and c["flush_not_durable_total"] == 2
    dst = bytearray(5 * BB)  # DRAM still serves what it accepted
    assert m.get_into(NS, keys, dst) == 5 and bytes(dst) == b"".join(pl(keys).values())
    m.check_integrity()


def test_ssd_that_is_off_refuses_and_flush_says_so(store: Opened) -> None:
    m, ssd = store(io_error_limit=1)
    keys = chain(4, seed=5)
    m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    m.tiers[0].delete_namespace(NS)  # the next read goes to the SSD, which fails
    ssd.io_backend.read_errno = errno.EIO  # type: ignore[attr-defined]
    assert m.get_into(NS, keys, bytearray(4 * BB)) == 0
    assert ssd.mode == "off"
    more = chain(3, seed=6)
    assert m.commit(NS, more, pl(more), durability="ssd", timeout_s=10).durability == "dram"
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=10)
    assert e.value.refused_blocks == 3


def test_raising_ssd_is_refusal_not_success(store: Opened) -> None:
    m, ssd = store()
    ssd.close()  # every later call raises StoreUnavailable
    keys = chain(4, seed=7)
    assert m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10).durability == "dram"
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=10)
    assert e.value.refused_blocks == 4
    assert m.stats().counters["writeback_errors_total"] == 4


def test_blocks_already_in_dram_count_only_once_the_ssd_holds_them(store: Opened) -> None:
    m, ssd = store()
    keys = chain(4, seed=8)
    m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    ssd.delete_namespace(NS)  # DRAM holds them, the SSD no longer does
    res = m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    assert (res.present, res.durability) == (4, "ssd")
    assert ssd.contains(NS, keys) == 4, "the SSD copy was written again"
    read_only(ssd)
    ssd.delete_namespace(NS)
    res = m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    assert (res.present, res.durability) == (4, "dram")


def test_only_the_refused_blocks_are_reported(store: Opened) -> None:
    m, ssd = store()
    ssd.io_backend.write_budget_bytes = 4 * 4096  # type: ignore[attr-defined]  # 4 slots
    a, b = chain(4, seed=9), chain(5, seed=11)
    assert m.commit(NS, a, pl(a), durability="ssd", timeout_s=10).durability == "ssd"
    m.commit(NS, b, pl(b))  # the disk is full now
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=10)
    assert e.value.refused_blocks == 5
    assert ssd.contains(NS, a) == 4 and ssd.contains(NS, b) == 0
    m.check_integrity()


def test_promotion_and_write_back_keep_the_commit_checksum(store: Opened) -> None:
    m, ssd = store()
    keys = chain(3, seed=10)
    m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    from kvstore.block import payload_checksum

    want = [payload_checksum(payload_for(NS, k)) for k in keys]
    sums: list[int] = []
    assert ssd.get_into(NS, keys, bytearray(3 * BB), checksums=sums) == 3
    assert sums == want
    m.tiers[0].delete_namespace(NS)
    sums = []
    assert m.get_into(NS, keys, bytearray(3 * BB), checksums=sums) == 3  # promoted
    assert sums == want
    sums = []
    assert m.tiers[0].get_into(NS, keys, bytearray(3 * BB), checksums=sums) == 3
    assert sums == want


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["dram", "ssd", "flush", "fail", "heal"]), st.integers(1, 6)),
        max_size=14,
    )
)
def test_every_refused_block_is_reported_once_and_every_ssd_ack_holds(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    ssd = SSDTier(make_config(tmp_path_factory.mktemp("ssd"), io_backend="faulty"))
    top = DramTier(DramConfig(32 * BB, chunk_bytes=8 * BB))
    m = TierManager([top, ssd], ManagerConfig(max_dirty_bytes=16 * BB))
    m.register(NS)
    reported, acked = 0, []
    try:
        for seed, (op, n) in enumerate(ops):
            if op in ("dram", "ssd"):
                keys = chain(n, seed=1000 + seed)
                res = m.commit(NS, keys, pl(keys), durability=op, timeout_s=10)  # type: ignore[arg-type]
                if res.durability == "ssd":
                    acked.extend(keys)
            elif op == "flush":
                try:
                    m.flush(timeout_s=10)
                except NotDurable as e:
                    reported += e.refused_blocks
            elif op == "fail":
                ssd.io_backend.write_errno = errno.EIO  # type: ignore[attr-defined]
            else:
                ssd.io_backend.write_errno = None  # type: ignore[attr-defined]
        try:
            m.flush(timeout_s=10)
        except NotDurable as e:
            reported += e.refused_blocks
        assert reported == m.stats().counters["writeback_refused_total"]
        assert all(ssd.contains(NS, [k]) == 1 for k in acked), "an ssd ack without the block"
        m.check_integrity()
    finally:
        m.close()


def test_write_back_keeps_two_ssd_group_commits_in_flight(store: Opened) -> None:
    # The first batch's SSD put stops once its data is durable, before it publishes, and
    # goes on only when another put has submitted its writes: only a second flusher can
    # (with one, the gate stays shut and the first put reports it). With the per-put data
    # sync, where a put's sync is its longest step; behind the puts, each put's writes
    # overlap the other's without it.
    submitted: set[str] = set()  # threads whose SSD put has submitted its writes
    cond = threading.Condition()
    seen: list[str] = []

    def gate(point: str) -> None:
        me = threading.current_thread().name
        if point == "before_data_sync":
            with cond:
                submitted.add(me)
                cond.notify_all()
        elif point == "after_data_sync" and not seen:
            with cond:  # only a failing run waits long
                opened = cond.wait_for(lambda: submitted - {me}, timeout=60)
            seen.append("overlapped" if opened else "one group commit at a time")

    m, ssd = store(batch_blocks=8, crash_hook=gate, data_sync="per_put")
    a, b = chain(8, seed=21), chain(8, seed=22)
    m.commit(NS, a, pl(a))
    m.commit(NS, b, pl(b))
    m.flush(timeout_s=60)
    assert seen == ["overlapped"]
    assert ssd.contains(NS, a) == 8 and ssd.contains(NS, b) == 8
    c = m.stats().counters
    assert c["writeback_refused_total"] == 0 and c["writeback_blocks_total"] == 16
    m.check_integrity()
    ssd.check_integrity()


class OrderedTier(DramTier):
    """A lower tier that holds the put of ``held`` keys until ``go`` is set and refuses
    (raises on) puts of ``bad`` keys: batches then finish out of order."""

    def __init__(self) -> None:
        super().__init__(DramConfig(64 * BB, chunk_bytes=8 * BB, name="ssd"))
        self.held: set[bytes] = set()
        self.bad: set[bytes] = set()
        self.go = threading.Event()
        self.finished: list[bytes] = []

    def put(self, ns, keys, src, **kw):  # type: ignore[no-untyped-def]
        if keys[0] in self.held:
            assert self.go.wait(timeout=60), "the test never let the held put go"
        if keys[0] in self.bad:
            self.finished.append(keys[0])
            raise OSError(errno.EIO, "refused by the test")
        res = super().put(ns, keys, src, **kw)
        self.finished.append(keys[0])
        return res


def test_batches_finishing_out_of_order_are_done_only_in_order() -> None:
    low = OrderedTier()
    low.register(NS)
    wb = ThreadWriteBack([low], max_dirty_bytes=64 * BB, batch_blocks=4)
    try:
        a, b = chain(4, seed=31), chain(4, seed=32)
        low.held.add(a[0])
        low.bad.add(b[0])
        tickets = []
        for keys in (a, b):
            assert wb.reserve(4, BB, None) == 4
            tickets.append(wb.submit(NS, keys, b"".join(pl(keys).values()), [0] * 4))
        # Batch 2 (refused) finishes while batch 1 is held: its bytes leave the dirty
        # count, but neither batch is done, and its refusal is not claimable yet.
        give_up = time.monotonic() + 60
        while wb.dirty_bytes() != 4 * BB and time.monotonic() < give_up:
            time.sleep(0.01)
        assert low.finished == [b[0]] and wb.dirty_bytes() == 4 * BB
        assert wb.wait(1, deadline_s=time.monotonic()) is False
        assert wb.wait(2, deadline_s=time.monotonic()) is False
        assert wb.claim_refused(2) == 0
        wb.check_integrity()
        low.go.set()
        assert wb.wait(2, deadline_s=None)
        assert low.finished == [b[0], a[0]]
        assert [t.refused for t in tickets] == [0, 4]
        assert wb.claim_refused(1) == 0 and wb.claim_refused(2) == 4
        wb.check_integrity()
    finally:
        low.go.set()
        wb.close(deadline_s=None)


class AlignmentTier(DramTier):
    """A lower tier that notes where each put's rows lie."""

    def __init__(self) -> None:
        super().__init__(DramConfig(64 * BB, chunk_bytes=8 * BB, name="ssd"))
        self.offsets: list[int] = []

    def put(self, ns, keys, src, **kw):  # type: ignore[no-untyped-def]
        self.offsets.append(buffer_address(byte_view(src)) % 4096)
        return super().put(ns, keys, src, **kw)


def test_the_write_back_hands_the_lower_tier_page_aligned_rows() -> None:
    """The SSD tier writes page-aligned rows as they are and copies any other rows into
    its staging first: the flusher's copy of a commit must be page aligned (a ``bytes``
    join was not, so every write-back put paid that second copy)."""
    low = AlignmentTier()
    top = DramTier(DramConfig(32 * BB, chunk_bytes=8 * BB))
    m = TierManager([top, low], ManagerConfig(max_dirty_bytes=16 * BB, writeback_batch_blocks=4))
    try:
        m.register(NS)
        keys = chain(12, seed=41)
        m.commit(NS, keys, pl(keys))
        m.flush(timeout_s=60)  # raises NotDurable if the lower tier refused any
        assert low.offsets and set(low.offsets) == {0}
        out = np.zeros(12 * BB, np.uint8)
        assert low.get_into(NS, keys, out) == 12
        assert out.tobytes() == b"".join(pl(keys).values())
    finally:
        m.close()
