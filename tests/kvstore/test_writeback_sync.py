"""The tier manager's durability promise over an SSD that syncs its data behind its puts.

``durability="ssd"`` and ``flush()`` mean durable against power loss (DESIGN §5, §6), so
they wait for the SSD's data sync (``Tier.sync``), not only for its puts. Over the
``crashsim`` backend (writes held until synced) a power cut right after the promise
drops nothing; over the ``faulty`` backend a failing sync breaks the promise out loud.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore.dram import DramConfig, DramTier
from kvstore.errors import NotDurable
from kvstore.keys import chain_keys
from kvstore.manager import ManagerConfig, TierManager
from storage_nodes.ssd import SSDTier
from tests.conftest import payload_for, small_ns
from tests.storage_nodes.ssd.helpers import make_config

NS = small_ns()
BB = NS.block_bytes


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[list[TierManager]]:
    made: list[TierManager] = []
    yield made
    for m in made:
        m.close()


def _store(tmp_path: Path, made: list[TierManager], backend: str) -> tuple[TierManager, SSDTier]:
    ssd = SSDTier(make_config(tmp_path / "ssd", io_backend=backend))
    top = DramTier(DramConfig(64 * BB, chunk_bytes=8 * BB))
    m = TierManager([top, ssd], ManagerConfig(max_dirty_bytes=32 * BB))
    m.register(NS)
    made.append(m)
    return m, ssd


def _chain(n: int, seed: int) -> list[bytes]:
    return chain_keys(NS, np.random.default_rng(seed).integers(0, 1 << 20, n * NS.block_tokens))


def _payloads(keys: list[bytes]) -> dict[int, bytes]:
    return {i: payload_for(NS, k) for i, k in enumerate(keys)}


def _power_cut_drops_nothing(ssd: SSDTier) -> None:
    assert not ssd.io_backend._held  # type: ignore[attr-defined]
    ssd.io_backend.crash()  # type: ignore[attr-defined]
    assert ssd.io_backend.dropped_writes == 0  # type: ignore[attr-defined]


def test_an_ssd_durable_commit_survives_a_power_cut_at_once(
    tmp_path: Path, opened: list[TierManager]
) -> None:
    m, ssd = _store(tmp_path, opened, "crashsim")
    keys = _chain(8, seed=1)
    res = m.commit(NS, keys, _payloads(keys), durability="ssd", timeout_s=30)
    assert res.durability == "ssd"
    _power_cut_drops_nothing(ssd)


def test_flush_makes_written_back_blocks_durable(
    tmp_path: Path, opened: list[TierManager]
) -> None:
    m, ssd = _store(tmp_path, opened, "crashsim")
    for seed in range(3):
        keys = _chain(6, seed=10 + seed)
        m.commit(NS, keys, _payloads(keys))  # durability="dram": acknowledged at once
    m.flush(timeout_s=30)
    assert ssd.stats().counters["inserted"] == 18
    _power_cut_drops_nothing(ssd)


def test_a_failed_data_sync_breaks_the_promise_out_loud(
    tmp_path: Path, opened: list[TierManager]
) -> None:
    m, ssd = _store(tmp_path, opened, "faulty")
    ssd.io_backend.sync_errno = errno.EIO  # type: ignore[attr-defined]
    keys = _chain(8, seed=2)
    res = m.commit(NS, keys, _payloads(keys), durability="ssd", timeout_s=30)
    # written, not durable: the SSD put succeeded, its sync did not
    assert (res.inserted, res.durability) == (8, "dram")
    assert ssd.stats().counters["inserted"] == 8
    more = _chain(4, seed=3)
    m.commit(NS, more, _payloads(more))  # the SSD is read-only now: refused below
    with pytest.raises(NotDurable) as e:
        m.flush(timeout_s=30)
    assert e.value.refused_blocks == 4
    m.flush(timeout_s=30)  # each failure is reported once
    c = m.stats().counters
    assert c["writeback_sync_failed_total"] == 8 and c["flush_not_durable_total"] == 1
