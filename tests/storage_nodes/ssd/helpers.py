"""Shared by the SSD tests and their subprocess writers (importable without pytest)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvstore.keys import Key, Namespace, chain_keys
from storage_nodes.ssd import SSDConfig, SSDTier
from storage_nodes.ssd.io_backend import IORequest
from storage_nodes.ssd.slabs import probe_direct_io
from storage_nodes.testing.crash import SimulatedCrash, with_crash_hook

SLAB = 256 << 10


def small_ns(**overrides: Any) -> Namespace:
    fields: dict[str, Any] = dict(
        model_id="ssd-test",
        model_revision="r1",
        kv_dtype="float16",
        kv_layout="mha",
        cached_layers=(0, 1),
        kv_heads=2,
        head_dim=8,
        block_tokens=16,
    )  # 2 KiB payload: one 4 KiB slot
    fields.update(overrides)
    return Namespace(**fields)


def paged_ns() -> Namespace:
    """8 KiB payloads: whole pages, so each slot keeps its payload on pages of its own and
    page-aligned caller rows move to and from the disk without a staging copy."""
    return small_ns(model_id="ssd-test-paged", head_dim=32)


def aligned(data: bytes | int) -> memoryview:
    """A copy of ``data`` (or that many zero bytes) in page-aligned memory."""
    n = data if isinstance(data, int) else len(data)
    m = mmap.mmap(-1, max(n, 1))
    if not isinstance(data, int):
        m[:n] = data
    return memoryview(m)[:n]


def payload_for(ns: Namespace, key: bytes) -> bytes:
    """Deterministic payload derived from the key, so any reader can re-derive it."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.integers(0, 256, ns.block_bytes, dtype=np.uint8).tobytes()


def chain(ns: Namespace, n: int, salt: int = 0) -> list[Key]:
    return chain_keys(ns, np.arange(n * ns.block_tokens, dtype=np.uint32) + salt * 1_000_003)


def rows(ns: Namespace, keys: Sequence[Key]) -> bytes:
    return b"".join(payload_for(ns, k) for k in keys)


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make_config(d: Path, **kw: Any) -> SSDConfig:
    kw.setdefault("capacity_bytes", 16 * SLAB)
    kw.setdefault("slab_bytes", SLAB)
    kw.setdefault("sweep_interval_s", None)
    kw.setdefault("staging_max_bytes", 8 << 20)
    kw.setdefault("index_map_bytes", 256 << 20)
    hook = kw.pop("crash_hook", None)  # a test seam, not configuration
    config = SSDConfig(dir=d, **kw)
    return config if hook is None else with_crash_hook(config, hook)


def verify_all(tier: SSDTier, ns: Namespace) -> int:
    """Every key the index returns must read back (checksum and key checked by the tier)
    as exactly the bytes that were put. Returns how many keys were checked."""
    keys = tier.iter_keys(ns)
    dst = bytearray(ns.block_bytes)
    for k in keys:
        got = tier.get_into(ns, [k], dst)
        assert got == 1, f"key {k.hex()} is in the index but does not read back"
        assert bytes(dst) == payload_for(ns, k), f"key {k.hex()} read back wrong bytes"
    return len(keys)


def direct_fd(path: Path, size: int) -> int:
    """A file of ``size`` bytes opened for reads and writes, with O_DIRECT where the file
    system takes it."""
    flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if probe_direct_io(path.parent) else 0)
    fd = os.open(path, flags, 0o644)
    os.ftruncate(fd, size)
    return fd


class LazyBatch(Sequence[IORequest]):
    """A batch whose requests are made only when the backend asks (as the SSD engine's
    reads are): every backend must take any Sequence, not only a list. ``asked[i]``
    counts how often request ``i`` was asked for."""

    def __init__(self, reqs: list[IORequest]) -> None:
        self.reqs, self.asked = reqs, [0] * len(reqs)

    def __len__(self) -> int:
        return len(self.reqs)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        self.asked[i] += 1
        return self.reqs[i]


def log_submissions(monkeypatch: Any, log: list[Any], entry: Any) -> None:
    """Append ``entry(thread name)`` to ``log`` at each io_uring submission (``None``:
    nothing), through ``monkeypatch`` (pytest's): the order of a put's submissions
    against its other steps is what several tests check."""
    import threading

    from storage_nodes.ssd import uring

    real = uring._submit

    def submit(ring: Any) -> None:
        e = entry(threading.current_thread().name)
        if e is not None:
            log.append(e)
        real(ring)

    monkeypatch.setattr(uring, "_submit", submit)


class CrashOn:
    """A crash hook (``make_config(crash_hook=...)``): once ``armed``, raises
    ``SimulatedCrash`` the ``nth`` time the engine reaches ``point``."""

    def __init__(self, point: str, nth: int = 1) -> None:
        self.point = point
        self.nth = nth
        self.seen = 0
        self.armed = False

    def __call__(self, point: str) -> None:
        if self.armed and point == self.point:
            self.seen += 1
            if self.seen == self.nth:
                raise SimulatedCrash(point)
