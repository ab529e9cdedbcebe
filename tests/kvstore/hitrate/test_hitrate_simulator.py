"""The DESIGN §10 model on hand-computed traces: exact hit tokens per tier."""

from __future__ import annotations

import math

import pytest

from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.simulator import Simulator
from kvstore.units import Capacity

ZERO = Capacity(bytes_=0)
INF = Capacity()


def blocks(n: int) -> Capacity:
    """A capacity of exactly ``n`` blocks when block_tokens is 1."""
    return Capacity(tokens=n)


def replay(reqs: list[Request], **cfg: object) -> SimResult:
    base: dict[str, object] = {"hbm": ZERO, "dram": ZERO, "ssd": INF, "retention_s": math.inf}
    base.update(cfg)
    sim = Simulator(SimConfig(**base))  # type: ignore[arg-type]
    sim.feed(reqs)
    sim.check_integrity()
    return sim.result()


def r(t: float, big_l: int, keys: list[object], b: int = 1) -> Request:
    return Request(t, big_l, keys, b)


def test_block_weights_are_clipped_to_input_length() -> None:
    # B = 4: [1, 2, 3] over L = 10 weigh 4, 4, 2.
    res = replay(
        [
            r(0, 10, [1, 2, 3], 4),  # cold
            r(1, 9, [1, 2, 5], 4),  # 1, 2 hit: 8 tokens
            r(2, 6, [1, 2], 4),  # both hit, the second weighs 2: 6 tokens
            r(3, 12, [1, 2, 3], 4),  # all hit, block 3 now weighs 4: 12 tokens
            r(4, 4, [1, 2, 3], 4),  # ids past L weigh nothing: 4 tokens
        ]
    )
    assert res.input_tokens == 10 + 9 + 6 + 12 + 4
    assert res.hit_tokens == 8 + 6 + 12 + 4
    assert res.tier("ssd").hit_blocks == 2 + 2 + 3 + 3
    assert res.tier("ssd").hit_tokens == res.hit_tokens


def test_kv_cache_tester_tail_never_hits() -> None:
    # floor(L/B) full blocks: L = 70, B = 64 carries one id; the 6-token tail is never cached.
    res = replay([r(0, 70, [7], 64), r(1, 70, [7], 64)])
    assert res.hit_tokens == 64
    assert res.computed_tokens == 70 + 6


def test_each_hit_block_goes_to_the_fastest_tier_holding_it() -> None:
    res = replay(
        [
            r(0, 3, ["a", "b", "c"]),  # commit c, b, a: hbm {a}, dram {b, a}, ssd all
            r(1, 4, ["a", "b", "c", "d"]),  # a hbm, b dram, c ssd, d miss
            r(2, 2, ["e", "a"]),  # e misses, so a does not count; hbm {e}, dram {a, e}
            r(3, 2, ["a", "b"]),  # a dram, b ssd
        ],
        hbm=blocks(1),
        dram=blocks(2),
    )
    assert (
        res.tier("hbm").hit_tokens,
        res.tier("dram").hit_tokens,
        res.tier("ssd").hit_tokens,
    ) == (
        1,
        2,
        2,
    )
    assert res.hit_tokens == 5
    assert res.input_tokens == 11
    assert res.tier("hbm").capacity_blocks == 1
    assert res.tier("dram").capacity_blocks == 2
    assert math.isinf(res.tier("ssd").capacity_blocks)


def test_chains_are_evicted_tail_first() -> None:
    # Capacity 2: committing [a, b, c] last→first leaves {a, b}; the next turn hits a, b.
    res = replay([r(0, 3, ["a", "b", "c"]), r(1, 3, ["a", "b", "c"])], ssd=blocks(2))
    assert res.hit_tokens == 2


def test_lookup_has_no_side_effects() -> None:
    sim = Simulator(SimConfig(hbm=ZERO, dram=blocks(2), ssd=ZERO))
    sim.feed([r(0, 2, ["a", "b"])])
    before = list(sim.tiers[0].policy)
    assert sim.lookup(r(1, 3, ["b", "a", "x"])) == (2, [1, 1])
    assert list(sim.tiers[0].policy) == before


def test_ssd_retention_expires_idle_blocks_before_the_lookup() -> None:
    reqs = [
        r(0, 2, ["a", "b"]),
        r(5, 1, ["a"]),  # a idle 5 s: hit; touched at 5
        r(15, 2, ["a", "b"]),  # a idle 10 = retention: kept; b idle 15: expired
    ]
    res = replay(reqs, retention_s=10.0)
    assert res.hit_tokens == 1 + 1
    # --time-scale 2 doubles every idle time: a is gone by the third request too.
    res2 = replay(reqs, retention_s=10.0, time_scale=2.0)
    assert res2.hit_tokens == 1 + 0


def test_retention_applies_to_the_ssd_only() -> None:
    reqs = [r(0, 1, ["a"]), r(100, 1, ["a"])]
    assert replay(reqs, dram=blocks(4), ssd=ZERO, retention_s=10.0).hit_tokens == 1
    assert replay(reqs, dram=ZERO, ssd=blocks(4), retention_s=10.0).hit_tokens == 0


def test_time_never_runs_backwards() -> None:
    # A request logged late (t = 1 after t = 100) is replayed at 100, when a (last used at
    # 0) has been idle past the 60 s retention.
    res = replay([r(0, 1, ["a"]), r(100, 1, ["b"]), r(1, 1, ["a"])], retention_s=60.0)
    assert res.hit_tokens == 0


def test_ratios_replay_and_computed_tokens() -> None:
    res = replay(
        [r(0, 5, [1, 2, 3, 4, 5]), r(1, 5, [1, 2, 3, 4, 5]), r(2, 4, [1, 2, 9, 9])],
        replay_keep_tokens=3,
    )
    assert res.hit_tokens == 5 + 2
    assert res.mean_request_hit_ratio == pytest.approx((0 + 1 + 0.5) / 3)
    assert res.token_hit_rate == pytest.approx(7 / 14)
    assert res.computed_tokens == 7
    assert res.replay_extra_tokens == 3 + 2  # min(3, 5) + min(3, 2)
    assert res.computed_tokens_with_replay == 12


def test_zero_capacity_tier_is_absent_but_a_tiny_one_is_present() -> None:
    res = replay([r(0, 1, ["a"]), r(1, 1, ["a"])], dram=Capacity(bytes_=10), ssd=ZERO)
    assert res.hit_tokens == 0
    assert res.tier("dram").present and res.tier("dram").capacity_blocks == 0
    assert not res.tier("ssd").present


def test_capacity_in_bytes_uses_block_tokens_and_bytes_per_token() -> None:
    # 3 blocks of 4 tokens at 10 B/token = 120 B; 119 B holds 2 blocks.
    res = replay([r(0, 8, [1, 2], 4)], ssd=Capacity(bytes_=119), bytes_per_token=10.0)
    assert res.tier("ssd").capacity_blocks == 2


def test_mixed_block_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="block sizes 4 and 8"):
        replay([r(0, 4, [1], 4), r(1, 8, [1], 8)])


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_every_policy_of_the_registry_runs(policy: str) -> None:
    reqs = [r(t, 3, [t % 4, t % 3, t % 5]) for t in range(50)]
    res = replay(reqs, dram=blocks(3), ssd=blocks(6), policy=policy, retention_s=20.0)
    assert 0 < res.hit_tokens < res.input_tokens


def test_unknown_policy_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy"):
        Simulator(SimConfig(policy="fifo9"))
