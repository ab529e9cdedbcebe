"""Every capacity point of an LRU replay in one pass over the input (``_hitrate.c``).

Each tier is an LRU over the same stream of commits, so one stack of reuse distances
(Mattson et al., 1970) answers every tier and every point: a block is in a tier of capacity
``C`` iff its depth is ``<= C`` (and, in the SSD, it is not idle past the retention). The
native ``Stack`` keeps the depths in a Fenwick tree over last-access positions and adds
each point's DESIGN §10 totals per request — the same integer arithmetic as ``Simulator``
and the same floating-point sums in the same order, so results are equal, not close.

With ``sample_rate < 1`` (SHARDS) only keys hashed under the rate are tracked; capacities
are scaled by the rate and the tracked blocks' tokens by its inverse.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstore.hitrate.batches import AccessBatch
from kvstore.hitrate.config import TIER_NAMES, SimConfig, is_absent
from kvstore.hitrate.errors import ConfigError, HitrateError
from kvstore.hitrate.result import SimResult, TierResult


class MemoryLimitError(HitrateError):
    """The exact stack would outgrow ``--max-memory``."""


def native():  # type: ignore[no-untyped-def]
    try:
        from kvstore import _hitrate
    except ImportError as e:  # pragma: no cover - `make setup` builds it
        raise HitrateError(
            f"the native hit-rate module is not built ({e}); run `make setup`"
        ) from None
    return _hitrate


def builds_for(built_block_tokens: int, batch: AccessBatch) -> bool:
    """Whether a native replay built for ``built_block_tokens`` (0: not built yet) must be
    built for ``batch``; one replay takes one block size, a second one is refused."""
    if batch.block_tokens == built_block_tokens:
        return False
    if built_block_tokens:
        raise ConfigError(
            f"requests with block sizes {built_block_tokens} and {batch.block_tokens} "
            "in one replay; replay each block size separately"
        )
    return True


def feed_on_thread(
    batches: Iterable[AccessBatch], feed_batch: Callable[[AccessBatch], None]
) -> None:
    """``feed_batch`` each batch. The native replays release the GIL, so the replay runs on
    a thread of its own while this one reads and packs the next batch (two cores: both
    busy); the first error the replay raises is raised here."""
    pending: queue.Queue[AccessBatch | None] = queue.Queue(maxsize=2)
    failed: list[BaseException] = []

    def replay() -> None:
        while (batch := pending.get()) is not None:
            if not failed:
                try:
                    feed_batch(batch)
                except BaseException as e:  # handed to the reading thread
                    failed.append(e)

    worker = threading.Thread(target=replay, name="hitrate-replay", daemon=True)
    worker.start()
    try:
        for batch in batches:
            if failed:
                break
            pending.put(batch)
    finally:
        pending.put(None)
        worker.join()
    if failed:
        raise failed[0]


@dataclass(frozen=True, slots=True)
class PassStats:
    """What the pass saw: every access, the tracked (sampled) ones, the live stack."""

    accesses: int
    tracked_accesses: int
    live_blocks: int
    memory_bytes: int
    sample_rate: float


class OnePass:
    """Replays batches once for every config in ``points`` (each an LRU tier layout)."""

    def __init__(
        self,
        points: Sequence[SimConfig],
        *,
        sample_rate: float = 1.0,
        max_memory_bytes: int | None = None,
    ) -> None:
        if not points:
            raise ConfigError("no points to evaluate")
        first = points[0]
        for p in points:
            if p.policy != "lru":
                raise ConfigError("the one-pass replay needs --policy lru")
            if (p.retention_s, p.time_scale, p.replay_keep_tokens) != (
                first.retention_s,
                first.time_scale,
                first.replay_keep_tokens,
            ):
                raise ConfigError("one pass shares retention, time scale and replay keep")
        if not 0 < sample_rate <= 1:
            raise ConfigError(f"--sample must be in (0, 1], got {sample_rate}")
        self.points = list(points)
        self.sample_rate = sample_rate
        self.max_memory_bytes = max_memory_bytes
        self._stack: Any = None  # built on the first batch: capacities need the block size
        self._block_tokens = 0

    def _build(self, block_tokens: int) -> None:
        caps = []
        for cfg in self.points:
            for name in TIER_NAMES:
                blocks = cfg.capacity_blocks(name, block_tokens)
                # A sampled depth d stands for d / rate: compare it with C x rate.
                caps.append(-1 if math.isinf(blocks) else math.floor(blocks * self.sample_rate))
        first = self.points[0]
        self._stack = native().Stack(
            np.array(caps, dtype=np.int64),
            first.retention_s,
            first.time_scale,
            float(first.replay_keep_tokens),
            self.sample_rate,
            self.max_memory_bytes or 0,
        )
        self._block_tokens = block_tokens

    def feed(self, batches: Iterable[AccessBatch]) -> None:
        """Replay every batch (on a thread of its own: see ``feed_on_thread``)."""
        feed_on_thread(batches, self.feed_batch)

    def feed_batch(self, batch: AccessBatch) -> None:
        if builds_for(self._block_tokens, batch):
            self._build(batch.block_tokens)
        try:
            self._stack.feed(
                batch.keys, batch.offsets, batch.times_s, batch.lengths, batch.block_tokens
            )
        except MemoryError as e:
            what = "the sampled stack" if self.sample_rate < 1 else "the exact stack"
            if self.max_memory_bytes is None:  # the machine's memory, not the flag, ran out
                raise MemoryLimitError(
                    f"{what}: {e}; sample (--sample 0.01) or replay less at once"
                ) from None
            raise MemoryLimitError(
                f"--max-memory {self.max_memory_bytes / 2**20:,.0f} MiB: {what} {e}; "
                "raise --max-memory or sample (--sample 0.01)"
            ) from None

    def stats(self) -> PassStats:
        if self._stack is None:
            return PassStats(0, 0, 0, 0, self.sample_rate)
        s = self._stack
        _, _, _, acc, tracked, _ = s.totals()
        return PassStats(acc, tracked, s.live_blocks, s.memory_bytes, self.sample_rate)

    def error_bounds(self) -> list[float]:
        """Per point, twice the standard error of the sampled token hit rate (~95 %), in
        percentage points; 0 when exact. Measured from the run itself: the tracked blocks
        fall in 16 hash buckets, each an independent estimate of the hit tokens, and their
        spread is the sampling error (SHARDS' depth rescaling error is not in it; the
        bench measures the whole error against the exact curve)."""
        if self._stack is None or self.sample_rate >= 1:
            return [0.0] * len(self.points)
        _, input_tokens, _, _, _, per_point = self._stack.totals()
        out = []
        for *_, buckets in per_point:
            k = len(buckets)
            est = [k * b / self.sample_rate for b in buckets]
            mean = sum(est) / k
            var = sum((e - mean) ** 2 for e in est) / (k - 1)
            se = math.sqrt(var / k)
            out.append(200 * se / input_tokens if input_tokens else 0.0)
        return out

    def check(self) -> None:
        if self._stack is not None:
            self._stack.check()

    def results(self) -> list[SimResult]:
        """One result per point (empty before the first batch)."""
        if self._stack is None:
            return []
        requests, input_tokens, ratio_requests, _, _, per_point = self._stack.totals()
        b, rate = self._block_tokens, self.sample_rate
        out = []
        for cfg, (tok, blk, ratio_sum, replay, _) in zip(self.points, per_point, strict=True):
            if rate < 1:  # a tracked block stands for 1 / rate blocks
                tok = tuple(round(t / rate) for t in tok)
                blk = tuple(round(x / rate) for x in blk)
            hit = min(sum(tok), input_tokens)
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
                    hit_tokens=hit,
                    ratio_sum=ratio_sum,
                    ratio_requests=ratio_requests,
                    replay_extra_tokens=round(replay),
                    block_tokens=b,
                    tiers=tiers,
                )
            )
        return out
