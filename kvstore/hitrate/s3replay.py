"""Every point of an S3-FIFO run (``--policy s3fifo``) from one read of the input.

S3-FIFO is not a stack algorithm (a bigger cache need not hold a superset of a smaller
one's blocks), so no single pass of reuse distances answers every capacity: each point is
still its own simulation. ``S3FifoReplay`` runs them all in ``_hitrate_s3fifo.c`` from one
read of the batches, each tier following ``kvstore/eviction/s3fifo.py`` step for step on
arrays indexed by block id, the key table and the SSD's idle expiry shared by the points.
The totals use ``Simulator``'s arithmetic in its order, so results are equal, not close.

Where the native module is not built (``make setup`` builds it) ``run_s3fifo`` falls back
to one ``Simulator`` replay per point, the reference the native replay is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from kvstore.hitrate.batches import AccessBatch
from kvstore.hitrate.config import TIER_NAMES, SimConfig, is_absent
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.onepass import builds_for, feed_on_thread
from kvstore.hitrate.readers import TraceReader
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult, TierResult
from kvstore.hitrate.simulator import Simulator
from kvstore.hitrate.sweep import SweepPoint, SweepSpec

try:
    from kvstore import _hitrate as _native
except ImportError:  # not compiled: only where `make setup` could not build it
    _native = None  # type: ignore[assignment]

BatchProgress = Callable[[Iterator[AccessBatch]], Iterator[AccessBatch]]
RequestProgress = Callable[[Iterator[Request]], Iterator[Request]]


def native_available() -> bool:
    """Whether the compiled replay is here (else ``run_s3fifo`` replays in Python)."""
    return _native is not None and hasattr(_native, "S3Fifo")


class S3FifoReplay:
    """Replays batches once for every config in ``points`` (each an S3-FIFO tier layout)."""

    def __init__(self, points: Sequence[SimConfig]) -> None:
        if not native_available():
            raise ConfigError("the native S3-FIFO replay is not built; run `make setup`")
        if not points:
            raise ConfigError("no points to evaluate")
        first = points[0]
        for p in points:
            if p.policy != "s3fifo":
                raise ConfigError("the S3-FIFO replay needs --policy s3fifo")
            if (p.retention_s, p.time_scale, p.replay_keep_tokens) != (
                first.retention_s,
                first.time_scale,
                first.replay_keep_tokens,
            ):
                raise ConfigError("one replay shares retention, time scale and replay keep")
        self.points = list(points)
        self._sim: Any = None  # built on the first batch: capacities need the block size
        self._block_tokens = 0

    def _build(self, block_tokens: int) -> None:
        caps = []
        for cfg in self.points:
            for name in TIER_NAMES:
                blocks = cfg.capacity_blocks(name, block_tokens)  # 0 when absent
                caps.append(-1 if math.isinf(blocks) else int(blocks))
        first = self.points[0]
        self._sim = _native.S3Fifo(
            np.array(caps, dtype=np.int64),
            first.retention_s,
            first.time_scale,
            first.replay_keep_tokens,
        )
        self._block_tokens = block_tokens

    def feed(self, batches: Iterable[AccessBatch]) -> None:
        feed_on_thread(batches, self.feed_batch)

    def feed_batch(self, batch: AccessBatch) -> None:
        if builds_for(self._block_tokens, batch):
            self._build(batch.block_tokens)
        self._sim.feed(batch.keys, batch.offsets, batch.times_s, batch.lengths, batch.block_tokens)

    @property
    def memory_bytes(self) -> int:
        return 0 if self._sim is None else int(self._sim.memory_bytes)

    def check(self) -> None:
        if self._sim is not None:
            self._sim.check()

    def results(self) -> list[SimResult]:
        """One result per point (empty before the first batch)."""
        if self._sim is None:
            return []
        requests, input_tokens, ratio_requests, _, per_point = self._sim.totals()
        b = self._block_tokens
        out = []
        for cfg, (tok, blk, ratio_sum, replay) in zip(self.points, per_point, strict=True):
            tiers = tuple(
                TierResult(
                    name=name,
                    hit_tokens=tok[i],
                    hit_blocks=blk[i],
                    capacity_blocks=cfg.capacity_blocks(name, b),
                    present=not is_absent(cfg.capacity(name)),
                )
                for i, name in enumerate(TIER_NAMES)
            )
            out.append(
                SimResult(
                    requests=requests,
                    input_tokens=input_tokens,
                    hit_tokens=sum(tok),
                    ratio_sum=ratio_sum,
                    ratio_requests=ratio_requests,
                    replay_extra_tokens=replay,
                    block_tokens=b,
                    tiers=tiers,
                )
            )
        return out


def run_s3fifo(
    reader: TraceReader,
    config: SimConfig,
    specs: Sequence[SweepSpec],
    batch_progress: BatchProgress = lambda it: it,
    request_progress: RequestProgress = lambda it: it,
) -> tuple[SimResult, list[SweepPoint]]:
    """The base result and every sweep point's: natively from one read of the input, or,
    without the native module, one ``Simulator`` replay per point."""
    configs = [config]
    labels: list[tuple[str, Any]] = []
    for spec in specs:
        for cap in spec.points:
            configs.append(config.with_capacity(spec.tier, cap))
            labels.append((spec.tier, cap))
    if native_available():
        engine = S3FifoReplay(configs)
        engine.feed(batch_progress(reader.batches()))
        results = engine.results()
        if not results:
            raise ConfigError("the input holds no requests")
    else:
        results = []
        for cfg in configs:
            sim = Simulator(cfg)
            sim.feed(request_progress(reader.requests()))
            results.append(sim.result())
    points = [
        SweepPoint(tier, cap, res) for (tier, cap), res in zip(labels, results[1:], strict=True)
    ]
    return results[0], points
