"""A whole ``kvstore hitrate`` run through the one-pass engine (``--policy lru``): the base
configuration and every sweep point from one read of the input, exact or sampled."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from kvstore.hitrate.batches import AccessBatch
from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.onepass import OnePass
from kvstore.hitrate.readers import TraceReader
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.sweep import SweepPoint, SweepSpec

Progress = Callable[[Iterator[AccessBatch]], Iterator[AccessBatch]]


@dataclass(frozen=True, slots=True)
class PassOptions:
    """``--sample RATE`` (1 = ``--exact``) and ``--max-memory`` (None = no limit)."""

    sample_rate: float = 1.0
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1 or math.isnan(self.sample_rate):
            raise ConfigError(f"--sample must be a rate in (0, 1], got {self.sample_rate:g}")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise ConfigError("--max-memory must be positive")


@dataclass(frozen=True, slots=True)
class Method:
    """How the figures were computed, for the report."""

    name: str  # "exact" (one pass), "sampled" (one pass, SHARDS) or "replay" (per point)
    sample_rate: float
    accesses: int
    tracked_accesses: int
    live_blocks: int
    memory_bytes: int
    error_bound_points: float  # the largest over the curve, 0 when exact
    point_error_bounds: tuple[float, ...]  # base first, then each sweep point

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "sample_rate": self.sample_rate,
            "block_accesses": self.accesses,
            "tracked_accesses": self.tracked_accesses,
            "live_blocks": self.live_blocks,
            "stack_bytes": self.memory_bytes,
            "error_bound_points": self.error_bound_points,
        }

    def text(self) -> str:
        if self.name == "exact":
            return f"method  exact (one pass, {self.accesses:,} block accesses)"
        if self.name == "replay":
            return "method  exact (one replay per point)"
        return (
            f"method  sampled (SHARDS) at rate {self.sample_rate:g}: "
            f"{self.tracked_accesses:,} of {self.accesses:,} block accesses tracked; "
            f"error bound ±{self.error_bound_points:.2f} points (2 s.e., measured)"
        )


def run_one_pass(
    reader: TraceReader,
    config: SimConfig,
    specs: Sequence[SweepSpec],
    options: PassOptions,
    progress: Progress = lambda it: it,
) -> tuple[SimResult, list[SweepPoint], Method]:
    """The base result, every sweep point's, and how they were computed."""
    configs = [config]
    labels: list[tuple[str, object]] = []
    for spec in specs:
        for cap in spec.points:
            configs.append(config.with_capacity(spec.tier, cap))
            labels.append((spec.tier, cap))
    engine = OnePass(
        configs, sample_rate=options.sample_rate, max_memory_bytes=options.max_memory_bytes
    )
    engine.feed(progress(reader.batches()))
    results = engine.results()
    if not results:
        raise ConfigError("the input holds no requests")
    bounds = engine.error_bounds()
    stats = engine.stats()
    method = Method(
        name="exact" if options.sample_rate >= 1 else "sampled",
        sample_rate=options.sample_rate,
        accesses=stats.accesses,
        tracked_accesses=stats.tracked_accesses,
        live_blocks=stats.live_blocks,
        memory_bytes=stats.memory_bytes,
        error_bound_points=max(bounds),
        point_error_bounds=tuple(bounds),
    )
    points = [
        SweepPoint(tier, cap, res)  # type: ignore[arg-type]
        for (tier, cap), res in zip(labels, results[1:], strict=True)
    ]
    return results[0], points, method
