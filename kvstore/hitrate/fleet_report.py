"""How a ``--replicas`` run prints: a table by routing (hit rate by tier, requests per
replica), the shared store's benefit to ``round_robin``, and each routing's sweep."""

from __future__ import annotations

from kvstore.hitrate.config import SimConfig, is_absent
from kvstore.hitrate.fleet import FleetRun, StoreBenefit
from kvstore.hitrate.report import Prices, sweep_header, sweep_row, to_json
from kvstore.hitrate.result import SimResult


def _share(tokens: int, r: SimResult) -> float:
    return tokens / r.input_tokens if r.input_tokens else 0.0


def by_tier(r: SimResult) -> dict[str, float]:
    """Share of input tokens served by each tier, and the rest (``miss``); sums to 1."""
    out = {t.name: _share(t.hit_tokens, r) for t in r.tiers}
    out["miss"] = _share(r.computed_tokens, r)
    return out


def _benefit_json(b: StoreBenefit) -> dict[str, object]:
    return {
        "routing": "round_robin",
        "pools_alone": b.pools_alone.to_dict(),
        "with_store": b.with_store.to_dict(),
        "token_hit_rate_gain_points": b.gain_points,
    }


def fleet_json(run: FleetRun, config: SimConfig, prices: Prices) -> dict[str, object]:
    """The single-engine object for the first routing (same keys as without ``--replicas``),
    plus ``replicas``, ``dram_per_replica``, ``routing.{name}`` and ``store_benefit``."""
    first = run.outcomes[0]
    body = to_json(first.result, config, prices, sweep=first.sweep, sweep_method="replay")
    body["replicas"] = run.fleet.replicas
    body["dram_per_replica"] = run.fleet.dram_per_replica
    body["routing"] = {
        o.routing: {
            **to_json(o.result, config, prices, sweep=o.sweep, sweep_method="replay"),
            "by_tier": by_tier(o.result),
            "requests_per_replica": list(o.requests_per_replica),
        }
        for o in run.outcomes
    }
    body["store_benefit"] = None if run.store_benefit is None else _benefit_json(run.store_benefit)
    return body


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _size(config: SimConfig, tier: str, where: str) -> str:
    cap = config.capacity(tier)
    return "absent" if is_absent(cap) else f"{cap} {where}"


def fleet_text(run: FleetRun, config: SimConfig) -> str:
    f = run.fleet
    own_dram = "per replica" if f.dram_per_replica else "shared"
    lines = [
        f"replicas {f.replicas}: hbm {_size(config, 'hbm', 'per replica')}, "
        f"dram {_size(config, 'dram', own_dram)}, ssd {_size(config, 'ssd', 'shared')}",
        "",
        f"{'routing':<17}{'token hit':>11}{'req ratio':>11}{'hbm':>10}{'dram':>10}{'ssd':>10}"
        f"{'miss':>10}   requests per replica",
    ]
    for o in run.outcomes:
        r = o.result
        shares = by_tier(r)
        lines.append(
            f"{o.routing:<17}{_pct(r.token_hit_rate):>11}{_pct(r.mean_request_hit_ratio):>11}"
            + "".join(f"{_pct(shares[k]):>10}" for k in ("hbm", "dram", "ssd", "miss"))
            + "   "
            + " ".join(str(n) for n in o.requests_per_replica)
        )
    b = run.store_benefit
    if b is not None:
        lines += [
            "",
            f"shared store, round_robin: replica pools alone {_pct(b.pools_alone.token_hit_rate)}"
            f", with the store {_pct(b.with_store.token_hit_rate)} ({b.gain_points:+.2f} points)",
        ]
    for o in run.outcomes:
        if o.sweep:
            lines += ["", f"sweep (replay, {o.routing})", sweep_header()]
            lines += [sweep_row(p) for p in o.sweep]
    return "\n".join(lines)
