"""Capacity sweeps: ``--sweep dram=1GiB..1TiB:x2``.

With ``lru`` the sweep is one pass: the fixed tiers are simulated once and the swept tier's
presence at every capacity comes from its stack distance (``stackdist``). Hits depend on
the swept capacity ``C`` only through ``depth <= C``, so each hit block adds its tokens to a
difference array at the smallest swept capacity that reaches it. Other policies (not stack
algorithms) replay the input once per point.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kvstore.hitrate.config import TIER_NAMES, SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.simulator import Simulator
from kvstore.hitrate.sweep_accum import SweepAccumulator
from kvstore.units import Capacity, parse_capacity

MAX_POINTS = 256
_RANGE_RE = re.compile(r"^(?P<lo>[^.]+)\.\.(?P<hi>[^:]+):(?P<step>[x*+].+)$")


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """One swept tier and its capacities, ascending."""

    tier: str
    points: tuple[Capacity, ...]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    tier: str
    capacity: Capacity
    result: SimResult


def _amount(c: Capacity) -> int:
    return c.bytes_ if c.bytes_ is not None else c.tokens or 0


def _like(c: Capacity, amount: int) -> Capacity:
    return Capacity(bytes_=amount) if c.bytes_ is not None else Capacity(tokens=amount)


def parse_sweep(text: str) -> SweepSpec:
    """``TIER=LO..HI:xF`` (geometric), ``TIER=LO..HI:+STEP`` (linear) or ``TIER=A,B,C``."""
    tier, sep, rest = text.partition("=")
    tier = tier.strip().lower()
    if not sep or tier not in TIER_NAMES:
        raise ConfigError(
            f"invalid --sweep {text!r}: use TIER=LO..HI:x2 with TIER in hbm, dram, ssd"
        )
    rest = rest.strip().replace(" ", "")
    m = _RANGE_RE.match(rest)
    if m is None:
        if ".." in rest:
            raise ConfigError(f"invalid --sweep {text!r}: a range needs a step, e.g. :x2 or :+1GiB")
        points = [parse_capacity(p) for p in rest.split(",") if p]
    else:
        lo, hi = parse_capacity(m["lo"]), parse_capacity(m["hi"])
        points = _range(text, lo, hi, m["step"])
    if not points:
        raise ConfigError(f"invalid --sweep {text!r}: no capacities")
    if any(p.unbounded for p in points):
        raise ConfigError(f"invalid --sweep {text!r}: sweep capacities must be finite")
    if len({p.bytes_ is None for p in points}) > 1:
        raise ConfigError(f"invalid --sweep {text!r}: mix of byte sizes and token counts")
    if len(points) > MAX_POINTS:
        raise ConfigError(f"invalid --sweep {text!r}: more than {MAX_POINTS} points")
    points = sorted(set(points), key=_amount)
    return SweepSpec(tier, tuple(points))


def _range(text: str, lo: Capacity, hi: Capacity, step: str) -> list[Capacity]:
    if lo.unbounded or hi.unbounded:
        raise ConfigError(f"invalid --sweep {text!r}: range ends must be finite")
    if (lo.bytes_ is None) != (hi.bytes_ is None):
        raise ConfigError(f"invalid --sweep {text!r}: both ends in bytes or both in tokens")
    a, b = _amount(lo), _amount(hi)
    if a > b:
        raise ConfigError(f"invalid --sweep {text!r}: {lo} is above {hi}")
    out: list[Capacity] = []
    if step[0] in "x*":
        try:
            factor = float(step[1:])
        except ValueError:
            raise ConfigError(f"invalid --sweep {text!r}: bad factor {step!r}") from None
        if not factor > 1 or a <= 0:
            raise ConfigError(f"invalid --sweep {text!r}: a geometric sweep needs LO > 0 and x > 1")
        v = float(a)
        while round(v) <= b and len(out) <= MAX_POINTS:
            out.append(_like(lo, round(v)))
            v *= factor
    else:
        inc = _amount(parse_capacity(step[1:]))
        if inc <= 0:
            raise ConfigError(f"invalid --sweep {text!r}: step must be positive")
        v = a
        while v <= b and len(out) <= MAX_POINTS:
            out.append(_like(lo, v))
            v += inc
    return out


class StackSweep:
    """One pass for the base run and every swept tier (policy ``lru`` only)."""

    def __init__(self, config: SimConfig, specs: Iterable[SweepSpec]) -> None:
        if config.policy != "lru":
            raise ConfigError("the single-pass sweep needs --policy lru")
        self.config = config
        self.base = Simulator(config)
        self.specs = list(specs)
        self._accums: list[SweepAccumulator] = []

    def feed(self, requests: Iterable[Request]) -> None:
        base = self.base
        for req in requests:
            now = base.advance(req)
            if not self._accums:
                self._accums = [
                    SweepAccumulator(self.config, s.tier, s.points, base.block_tokens)
                    for s in self.specs
                ]
            membership = base.membership()
            for acc in self._accums:
                acc.account(req, membership, now)
            base.step(req, now)
            for acc in self._accums:
                acc.commit(req, now)

    def points(self) -> list[SweepPoint]:
        """Every swept capacity's result; none before the first request."""
        if not self._accums:
            return []
        base = self.base.result()
        out = []
        for spec, acc in zip(self.specs, self._accums, strict=True):
            for cap, result in zip(spec.points, acc.results(base), strict=True):
                out.append(SweepPoint(spec.tier, cap, result))
        return out


    def check_integrity(self) -> None:
        self.base.check_integrity()
        for acc in self._accums:
            acc.stack.check_integrity()


def run_sweep(
    requests: Callable[[], Iterator[Request]], config: SimConfig, specs: list[SweepSpec]
) -> tuple[SimResult, list[SweepPoint], str]:
    """The base result, every sweep point, and the method used (``stack`` or ``replay``).
    ``requests()`` returns a fresh iterator over the input each call."""
    if config.policy == "lru":
        sweep = StackSweep(config, specs)
        sweep.feed(requests())
        return sweep.base.result(), sweep.points(), "stack"
    base = Simulator(config)
    base.feed(requests())
    points = []
    for spec in specs:
        for cap in spec.points:
            sim = Simulator(config.with_capacity(spec.tier, cap))
            sim.feed(requests())
            points.append(SweepPoint(spec.tier, cap, sim.result()))
    return base.result(), points, "replay"


__all__ = ["SweepPoint", "SweepSpec", "parse_sweep", "run_sweep"]
