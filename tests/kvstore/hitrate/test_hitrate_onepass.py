"""The one-pass engine (``_hitrate.c`` through ``OnePass``) equals the simulator exactly."""

from __future__ import annotations

import math
import random
import resource

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hitrate_properties import cap, traces

from kvstore.hitrate.batches import AccessBatch, batches_of, rows_of
from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.onepass import MemoryLimitError, OnePass
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.simulator import Simulator
from kvstore.units import Capacity

tier_caps = st.one_of(st.just(0), st.integers(1, 12), st.just(math.inf))
retentions = st.sampled_from([math.inf, 3.0, 20.0])


def simulate(reqs: list[Request], cfg: SimConfig) -> SimResult:
    sim = Simulator(cfg)
    sim.feed(reqs)
    return sim.result()


def one_pass(reqs: list[Request], cfgs: list[SimConfig], batch: int = 7) -> list[SimResult]:
    engine = OnePass(cfgs)
    engine.feed(batches_of(rows_of(reqs), accesses=batch))  # many small batches
    engine.check()
    return engine.results()


def shifted(reqs: list[Request], offset: int) -> list[Request]:
    """Keys moved out of the directly indexed range (into the native hash table)."""
    return [Request(r.time_s, r.input_tokens, [k + offset for k in r.keys], 4) for r in reqs]


@settings(max_examples=150, deadline=None)
@given(
    traces(),
    st.lists(st.tuples(tier_caps, tier_caps, tier_caps), min_size=1, max_size=4),
    retentions,
    st.sampled_from([1.0, 0.5, 7.0]),
    st.sampled_from([0, 1 << 40]),
)
def test_every_point_equals_the_simulator(
    reqs: list[Request],
    layouts: list[tuple[float, float, float]],
    ret: float,
    scale: float,
    key_offset: int,
) -> None:
    reqs = shifted(reqs, key_offset)
    cfgs = [
        SimConfig(
            hbm=cap(h),
            dram=cap(d),
            ssd=cap(s),
            retention_s=ret,
            time_scale=scale,
            replay_keep_tokens=3,
        )
        for h, d, s in layouts
    ]
    for cfg, got in zip(cfgs, one_pass(reqs, cfgs), strict=True):
        assert got == simulate(reqs, cfg)  # every field, the float ratio sum bit for bit


def agent_trace(n: int, seed: int, key_offset: int = 0) -> list[Request]:
    """Sessions that grow and restart, long enough to renumber positions and grow tables."""
    rng = random.Random(seed)
    sessions: list[list[int]] = [[]]
    next_id = key_offset
    out = []
    t = 0.0
    for _ in range(n):
        if rng.random() < 0.1:
            sessions.append([])
        s = rng.choice(sessions[-8:])
        grow = rng.randint(1, 20)
        s.extend(range(next_id, next_id + grow))
        next_id += grow
        if len(s) > 300:
            del s[: len(s) - 30]
        keys = list(s)
        if rng.random() < 0.05 and keys:
            keys.append(keys[0])  # a chain that repeats a key
        t += rng.choice([0.0, 1.0, 30.0])
        out.append(Request(t, len(keys) * 4 - rng.randint(0, 3), keys, 4))
    return out


@pytest.mark.parametrize("key_offset", [0, 1 << 40])
def test_long_trace_with_renumbering_and_expiry(key_offset: int) -> None:
    reqs = agent_trace(1500, seed=1, key_offset=key_offset)
    for ret in (math.inf, 72 * 3600.0, 100.0):  # one pass shares one retention
        cfgs = [
            SimConfig(retention_s=ret),
            SimConfig(ssd=Capacity(tokens=4 * 500), retention_s=ret),
            SimConfig(
                hbm=Capacity(tokens=4 * 50),
                dram=Capacity(tokens=4 * 400),
                ssd=Capacity(tokens=4 * 2000),
                retention_s=ret,
            ),
        ]
        for cfg, got in zip(cfgs, one_pass(reqs, cfgs, batch=5000), strict=True):
            assert got == simulate(reqs, cfg)


def test_sampling_at_rate_one_is_exact_and_a_low_rate_is_close() -> None:
    reqs = agent_trace(3000, seed=2)
    cfgs = [SimConfig(ssd=Capacity(tokens=4 * c)) for c in (300, 1000, 3000)] + [SimConfig()]
    exact = one_pass(reqs, cfgs, batch=1 << 16)
    engine = OnePass(cfgs, sample_rate=1.0)
    engine.feed(batches_of(rows_of(reqs)))
    assert engine.results() == exact
    assert engine.error_bounds() == [0.0] * len(cfgs)
    sampled = OnePass(cfgs, sample_rate=0.25)
    sampled.feed(batches_of(rows_of(reqs)))
    stats = sampled.stats()
    assert 0.15 < stats.tracked_accesses / stats.accesses < 0.35
    for want, got, bound in zip(exact, sampled.results(), sampled.error_bounds(), strict=True):
        assert got.requests == want.requests and got.input_tokens == want.input_tokens
        assert abs(got.token_hit_rate - want.token_hit_rate) < 0.05
        assert 0 < bound < 5


def test_block_size_change_is_refused() -> None:
    engine = OnePass([SimConfig()])
    engine.feed(batches_of(rows_of([Request(0.0, 8, [1, 2], 4)])))
    with pytest.raises(ValueError, match="block sizes 4 and 8"):
        engine.feed(batches_of(rows_of([Request(1.0, 8, [1], 8)])))


def test_max_memory_refuses_instead_of_growing() -> None:
    reqs = agent_trace(400, seed=3, key_offset=1 << 40)
    engine = OnePass([SimConfig()], max_memory_bytes=64 << 10)
    with pytest.raises(MemoryLimitError, match="--max-memory"):
        engine.feed(batches_of(rows_of(reqs)))


def bounded_batches(accesses: int, keys: int, seed: int) -> list[AccessBatch]:
    """Chains of 64 consecutive ids from a fixed set of ``keys`` ids, 1 s apart."""
    rng = np.random.default_rng(seed)
    per_batch = 1 << 18
    chain = 64
    out = []
    t = 0.0
    for _ in range(accesses // per_batch):
        starts = rng.integers(0, keys - chain, per_batch // chain)
        k = (starts[:, None] + np.arange(chain)).ravel().astype(np.uint64)
        n = len(starts)
        out.append(
            AccessBatch(
                keys=k,
                offsets=np.arange(0, (n + 1) * chain, chain, dtype=np.int64),
                times_s=t + np.arange(n, dtype=np.float64),
                lengths=np.full(n, chain * 16, dtype=np.int64),
                block_tokens=16,
            )
        )
        t += n
    return out


def test_memory_stays_bounded_by_the_live_blocks() -> None:
    """The stack's arrays stop growing once every key is live: 2 M and 20 M accesses of the
    same 50,000 keys need the same memory (the 1e9-access run is in bench/)."""
    batch = bounded_batches(1 << 21, keys=50_000, seed=4)
    engine = OnePass([SimConfig(ssd=Capacity(tokens=16 * 20_000)), SimConfig()])
    engine.feed(batch)
    after_2m = engine.stats().memory_bytes
    peak_2m = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for _ in range(9):
        engine.feed(batch)
    stats = engine.stats()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_2m < 16 << 10
    assert stats.accesses >= 20_000_000
    assert stats.memory_bytes == after_2m
    assert stats.memory_bytes < 8 << 20  # ~50,000 live blocks, not 20 M accesses
    engine.check()
