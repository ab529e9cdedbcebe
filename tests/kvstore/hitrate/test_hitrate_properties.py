"""Hypothesis properties of the simulator and the single-pass sweep."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.simulator import Simulator
from kvstore.hitrate.sweep import StackSweep, SweepSpec
from kvstore.units import Capacity

ZERO = Capacity(bytes_=0)
B = 4


@st.composite
def traces(draw: st.DrawFn, max_requests: int = 25) -> list[Request]:
    """Requests over a small id space so that hits, evictions and expiry all happen. Chains
    share prefixes (like real traces) and sometimes not (ids reused out of position)."""
    n = draw(st.integers(1, max_requests))
    reqs = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 1.0, 5.0, 30.0]))
        length = draw(st.integers(0, 6))
        if draw(st.booleans()):
            root = draw(st.integers(0, 3))
            keys = [root * 100 + i for i in range(length)]  # chained prefixes
        else:
            keys = draw(st.lists(st.integers(0, 12), min_size=length, max_size=length))
        big_l = (
            max(0, length * B - draw(st.integers(0, B - 1))) if length else draw(st.integers(0, 3))
        )
        reqs.append(Request(t, big_l, keys, B))
    return reqs


def cap(blocks: float) -> Capacity:
    return Capacity() if math.isinf(blocks) else Capacity(tokens=int(blocks) * B)


def run(reqs: list[Request], **cfg: object) -> SimResult:
    sim = Simulator(SimConfig(**cfg))  # type: ignore[arg-type]
    sim.feed(reqs)
    sim.check_integrity()
    return sim.result()


def first_occurrence_bound(reqs: list[Request]) -> int:
    """Hit tokens if nothing is ever evicted: the longest prefix of ids seen before."""
    seen: set[object] = set()
    total = 0
    for r in reqs:
        h = 0
        for k in r.keys:
            if k not in seen:
                break
            h += 1
        total += r.prefix_tokens(h)
        seen.update(r.keys)
    return total


tier_caps = st.one_of(st.just(0), st.integers(1, 12), st.just(math.inf))
retentions = st.sampled_from([math.inf, 3.0, 20.0])


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(0, 15), retentions)
def test_lru_hit_rate_is_monotone_in_capacity(reqs: list[Request], c: int, ret: float) -> None:
    for tier in ("dram", "ssd"):
        small = run(
            reqs, **{"hbm": ZERO, "dram": ZERO, "ssd": ZERO, tier: cap(c), "retention_s": ret}
        )
        big = run(
            reqs, **{"hbm": ZERO, "dram": ZERO, "ssd": ZERO, tier: cap(c + 1), "retention_s": ret}
        )
        assert small.hit_tokens <= big.hit_tokens


@settings(max_examples=60, deadline=None)
@given(traces())
def test_infinite_capacity_equals_the_first_occurrence_bound(reqs: list[Request]) -> None:
    res = run(reqs, hbm=ZERO, dram=ZERO, ssd=Capacity(), retention_s=math.inf)
    assert res.hit_tokens == first_occurrence_bound(reqs)
    assert res.tier("ssd").hit_tokens == res.hit_tokens


@settings(max_examples=80, deadline=None)
@given(traces(), tier_caps, tier_caps, tier_caps, retentions, st.sampled_from(["lru", "s3fifo"]))
def test_tier_hits_partition_the_total(
    reqs: list[Request], h: float, d: float, s: float, ret: float, policy: str
) -> None:
    res = run(reqs, hbm=cap(h), dram=cap(d), ssd=cap(s), retention_s=ret, policy=policy)
    assert sum(t.hit_tokens for t in res.tiers) == res.hit_tokens
    assert res.hit_tokens <= first_occurrence_bound(reqs)
    assert res.hit_tokens <= res.input_tokens
    # The union of the tiers never beats one unbounded tier.
    assert res.hit_tokens <= run(reqs, hbm=ZERO, dram=ZERO, ssd=Capacity()).hit_tokens


@settings(max_examples=60, deadline=None)
@given(
    traces(),
    tier_caps,
    tier_caps,
    tier_caps,
    retentions,
    st.sampled_from(["hbm", "dram", "ssd"]),
    st.lists(st.integers(0, 14), min_size=1, max_size=5, unique=True),
)
def test_single_pass_sweep_equals_one_replay_per_point(
    reqs: list[Request],
    h: float,
    d: float,
    s: float,
    ret: float,
    tier: str,
    points: list[int],
) -> None:
    config = SimConfig(hbm=cap(h), dram=cap(d), ssd=cap(s), retention_s=ret, replay_keep_tokens=3)
    spec = SweepSpec(tier, tuple(cap(p) for p in sorted(points)))
    sweep = StackSweep(config, [spec])
    sweep.feed(reqs)
    sweep.check_integrity()
    assert sweep.base.result() == run(reqs, **_fields(config))
    for point in sweep.points():
        want = run(reqs, **_fields(config.with_capacity(tier, point.capacity)))
        got = point.result
        assert [(t.hit_tokens, t.hit_blocks, t.capacity_blocks, t.present) for t in got.tiers] == [
            (t.hit_tokens, t.hit_blocks, t.capacity_blocks, t.present) for t in want.tiers
        ]
        assert got.hit_tokens == want.hit_tokens
        assert got.replay_extra_tokens == want.replay_extra_tokens
        assert math.isclose(got.ratio_sum, want.ratio_sum, rel_tol=1e-9, abs_tol=1e-9)


def _fields(c: SimConfig) -> dict[str, object]:
    return {
        "hbm": c.hbm,
        "dram": c.dram,
        "ssd": c.ssd,
        "retention_s": c.retention_s,
        "replay_keep_tokens": c.replay_keep_tokens,
    }
