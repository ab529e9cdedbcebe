"""What a replay is worth, and how it prints: cost model, JSON object and text table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.sweep import SweepPoint
from kvstore.units import format_bytes

_PER_M = 1e6
_S_PER_H = 3600.0


@dataclass(frozen=True, slots=True)
class Prices:
    """Input-token prices in $ per million tokens, and prefill throughput for GPU-hours."""

    cached_usd_per_m_tokens: float = 0.003
    uncached_usd_per_m_tokens: float = 0.15
    prefill_tokens_per_gpu_s: float = 9200.0

    def __post_init__(self) -> None:
        for name in ("cached_usd_per_m_tokens", "uncached_usd_per_m_tokens"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"price must be a finite non-negative number, got {v}")
        if not (self.prefill_tokens_per_gpu_s > 0 and math.isfinite(self.prefill_tokens_per_gpu_s)):
            raise ValueError(
                f"--prefill-tokens-per-gpu-s must be positive, got {self.prefill_tokens_per_gpu_s}"
            )


@dataclass(frozen=True, slots=True)
class Cost:
    """Input cost with the cache (hits at the cached price, the rest at the uncached one),
    without it, the blended $/M input tokens, and the prefill GPU-hours the hits save."""

    cached_input_usd: float
    uncached_input_usd: float
    total_input_usd: float
    no_cache_input_usd: float
    saved_usd: float
    blended_usd_per_m_input_tokens: float
    prefill_gpu_hours_saved: float
    prefill_gpu_hours_saved_with_replay: float  # hits minus the bounded-replay recompute


def cost_of(result: SimResult, prices: Prices) -> Cost:
    cached = result.hit_tokens * prices.cached_usd_per_m_tokens / _PER_M
    uncached = result.computed_tokens * prices.uncached_usd_per_m_tokens / _PER_M
    total = cached + uncached
    no_cache = result.input_tokens * prices.uncached_usd_per_m_tokens / _PER_M
    per_gpu_h = prices.prefill_tokens_per_gpu_s * _S_PER_H
    return Cost(
        cached_input_usd=cached,
        uncached_input_usd=uncached,
        total_input_usd=total,
        no_cache_input_usd=no_cache,
        saved_usd=no_cache - total,
        blended_usd_per_m_input_tokens=total / result.input_tokens * _PER_M
        if result.input_tokens
        else 0.0,
        prefill_gpu_hours_saved=result.hit_tokens / per_gpu_h,
        prefill_gpu_hours_saved_with_replay=(result.hit_tokens - result.replay_extra_tokens)
        / per_gpu_h,
    )


def _capacity_text(config: SimConfig, tier: str) -> str:
    return str(config.capacity(tier))


def to_json(
    result: SimResult,
    config: SimConfig,
    prices: Prices,
    *,
    sweep: Sequence[SweepPoint] = (),
    sweep_method: str | None = None,
) -> dict[str, object]:
    out = result.to_dict()
    tiers = cast(dict[str, dict[str, object]], out["tiers"])
    for name, body in tiers.items():
        body["capacity"] = _capacity_text(config, name)
    out["replay_keep_tokens"] = config.replay_keep_tokens
    out["policy"] = config.policy
    out["retention_s"] = None if math.isinf(config.retention_s) else config.retention_s
    out["bytes_per_token"] = config.bytes_per_token
    out["cost"] = {**asdict(cost_of(result, prices)), "prices": asdict(prices)}
    if sweep:
        out["sweep_method"] = sweep_method
        out["sweep"] = [
            {
                "tier": p.tier,
                "capacity": str(p.capacity),
                "capacity_bytes": p.capacity.bytes_,
                "capacity_tokens": p.capacity.tokens,
                **p.result.to_dict(),
            }
            for p in sweep
        ]
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _n(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{int(x):,}"


def to_text(
    result: SimResult,
    config: SimConfig,
    prices: Prices,
    *,
    sweep: Sequence[SweepPoint] = (),
    sweep_method: str | None = None,
) -> str:
    r = result
    lines = [
        f"requests                 {r.requests:>16,}",
        f"input tokens             {r.input_tokens:>16,}",
        f"hit tokens               {r.hit_tokens:>16,}",
        f"token hit rate           {_pct(r.token_hit_rate):>16}",
        f"mean request hit ratio   {_pct(r.mean_request_hit_ratio):>16}",
        f"computed tokens          {r.computed_tokens:>16,}",
        f"  with replay (keep {config.replay_keep_tokens:>4}) {r.computed_tokens_with_replay:>15,}",
        "",
        f"{'tier':<6}{'capacity':>12}{'blocks':>14}{'hit blocks':>14}{'hit tokens':>16}"
        f"{'of input':>10}",
    ]
    for t in r.tiers:
        if not t.present:
            lines.append(f"{t.name:<6}{'absent':>12}")
            continue
        share = t.hit_tokens / r.input_tokens if r.input_tokens else 0.0
        lines.append(
            f"{t.name:<6}{_capacity_text(config, t.name):>12}{_n(t.capacity_blocks):>14}"
            f"{t.hit_blocks:>14,}{t.hit_tokens:>16,}{_pct(share):>10}"
        )
    c = cost_of(r, prices)
    lines += [
        "",
        f"cost (per M input tokens: cached ${prices.cached_usd_per_m_tokens:g}, "
        f"uncached ${prices.uncached_usd_per_m_tokens:g})",
        f"  cached input           ${c.cached_input_usd:>15,.2f}",
        f"  uncached input         ${c.uncached_input_usd:>15,.2f}",
        f"  total                  ${c.total_input_usd:>15,.2f}   "
        f"(no cache ${c.no_cache_input_usd:,.2f})",
        f"  blended                ${c.blended_usd_per_m_input_tokens:>15.4f}   per M input tokens",
        f"  prefill GPU-hours saved {c.prefill_gpu_hours_saved:>15,.2f}   "
        f"({c.prefill_gpu_hours_saved_with_replay:,.2f} with replay; "
        f"{prices.prefill_tokens_per_gpu_s:,.0f} tokens/GPU-s)",
    ]
    if sweep:
        lines += ["", f"sweep ({sweep_method})", sweep_header()]
        lines += [sweep_row(p) for p in sweep]
    return "\n".join(lines)


def sweep_header() -> str:
    return (
        f"{'tier':<6}{'capacity':>12}{'blocks':>14}{'token hit':>11}{'req ratio':>11}"
        f"{'hbm':>10}{'dram':>10}{'ssd':>10}"
    )


def sweep_row(p: SweepPoint) -> str:
    r = p.result
    cap_text = format_bytes(p.capacity.bytes_) if p.capacity.bytes_ is not None else str(p.capacity)
    shares = [_pct(t.hit_tokens / r.input_tokens if r.input_tokens else 0.0) for t in r.tiers]
    return (
        f"{p.tier:<6}{cap_text:>12}{_n(r.tier(p.tier).capacity_blocks):>14}"
        f"{_pct(r.token_hit_rate):>11}{_pct(r.mean_request_hit_ratio):>11}"
        + "".join(f"{s:>10}" for s in shares)
    )
