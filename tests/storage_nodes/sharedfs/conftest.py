"""Helpers for the shared-FS tier's tests: a fake wall clock and daemons on one root."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore.keys import chain_keys
from storage_nodes.sharedfs import SharedFSConfig, SharedFSTier
from tests.conftest import payload_for, small_ns

NS = small_ns()
CAPACITY = 1 << 20
SEGMENT = 256 << 10


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, s: float) -> None:
        with self._lock:
            self.t += s


def config(root: Path, daemon: str, **kw: Any) -> SharedFSConfig:
    base: dict[str, Any] = dict(root=root, capacity_bytes=CAPACITY, segment_bytes=SEGMENT,
                                daemon_id=daemon, maintenance=False)
    base.update(kw)
    return SharedFSConfig(**base)


def chain(n: int, seed: int = 0, ns=NS) -> list[bytes]:
    return chain_keys(ns, np.random.default_rng(seed).integers(0, 50_000, n * ns.block_tokens))


def rows(keys: list[bytes], ns=NS) -> bytes:
    return b"".join(payload_for(ns, k) for k in keys)


def read(tier: SharedFSTier, keys: list[bytes], ns=NS) -> tuple[int, bytes]:
    dst = bytearray(len(keys) * ns.block_bytes)
    n = tier.get_into(ns, keys, dst)
    return n, bytes(dst[: n * ns.block_bytes])


def right_or_missed(tiers: list[SharedFSTier], chains: list[list[bytes]], ns=NS) -> int:
    """Read every chain through every tier: each gives the right bytes or a miss, never
    wrong ones. Returns the blocks served."""
    served = 0
    for keys in chains:
        for t in tiers:
            n, data = read(t, keys, ns)
            assert data == rows(keys[:n], ns), f"wrong bytes through {t.config.daemon_id}"
            served += n
    return served


@pytest.fixture
def daemons(tmp_path) -> Iterator[Callable[..., SharedFSTier]]:
    """``daemons("a", clock=...)`` opens a daemon on one shared root; all are closed."""
    opened: list[SharedFSTier] = []

    def open_(daemon: str, *, register: bool = True, **kw: Any) -> SharedFSTier:
        t = SharedFSTier(config(tmp_path / "root", daemon, **kw))
        opened.append(t)
        if register:
            t.register(NS)
        return t

    yield open_
    for t in opened:
        t.close()
