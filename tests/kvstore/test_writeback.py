"""Acknowledgements tell the truth (issue 14, item 1): the tier manager over the real SSD
engine in a temporary directory, healthy and failing (read-only, off, raising).

A commit is acknowledged at ``durability="ssd"`` only once the SSD accepted every block it
stored; ``flush`` raises ``NotDurable`` naming how many blocks the SSD refused; the
counters say the same.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.dram import DramConfig, DramTier
from kvstore.errors import NotDurable
from kvstore.keys import chain_keys
from kvstore.manager import ManagerConfig, TierManager
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

    def make(**kw: Any) -> tuple[TierManager, SSDTier]:
        kw.setdefault("io_backend", "faulty")
        ssd = SSDTier(make_config(tmp_path / f"ssd{len(made)}", **kw))
        top = DramTier(DramConfig(32 * BB, chunk_bytes=8 * BB))
        m = TierManager([top, ssd], ManagerConfig(max_dirty_bytes=16 * BB))
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
