"""Small DRAM tiers over two size classes, and chains of keys to fill them: shared by the
DRAM tier's tests (test_dram.py) and its slot allocator's (test_dram_slots.py)."""

from __future__ import annotations

import numpy as np

from kvstore.dram import DramConfig, DramTier
from kvstore.keys import chain_keys
from tests.conftest import payload_for, small_ns

SMALL = small_ns()  # 2 KiB blocks
BIG = small_ns(model_id="big", head_dim=32)  # 8 KiB blocks
CHUNK = 32 << 10


def make(chunks: int = 8, **kw) -> DramTier:
    t = DramTier(DramConfig(chunks * CHUNK, chunk_bytes=CHUNK, **kw))
    t.register(SMALL)
    t.register(BIG)
    return t


def chain(ns, n: int, seed: int) -> list[bytes]:
    return chain_keys(ns, np.random.default_rng(seed).integers(0, 1 << 20, n * ns.block_tokens))


def put(t: DramTier, ns, keys) -> None:
    t.put(ns, keys, b"".join(payload_for(ns, k) for k in keys))


def verify(t: DramTier, ns, keys) -> int:
    dst = bytearray(len(keys) * ns.block_bytes)
    n = t.get_into(ns, keys, dst)
    assert bytes(dst[: n * ns.block_bytes]) == b"".join(payload_for(ns, k) for k in keys[:n])
    return n
