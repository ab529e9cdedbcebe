"""The native S3-FIFO replay (``_hitrate_s3fifo.c`` through ``S3FifoReplay``) equals one
``Simulator`` replay per point exactly, and ``run_s3fifo`` falls back to the simulator
where the native module is missing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hitrate_onepass import agent_trace, shifted, simulate
from test_hitrate_properties import cap, traces

from kvstore.hitrate import s3replay
from kvstore.hitrate.batches import batches_of, rows_of
from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.readers import open_inputs
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.s3replay import S3FifoReplay, run_s3fifo
from kvstore.hitrate.sweep import parse_sweep
from kvstore.units import Capacity

tier_caps = st.one_of(st.just(0), st.integers(1, 12), st.just(math.inf))
retentions = st.sampled_from([math.inf, 3.0, 20.0])


def replay(reqs: list[Request], cfgs: list[SimConfig], batch: int = 7) -> list[SimResult]:
    engine = S3FifoReplay(cfgs)
    engine.feed(batches_of(rows_of(reqs), accesses=batch))  # many small batches
    engine.check()
    return engine.results()


def test_the_native_replay_is_built() -> None:
    assert s3replay.native_available(), "kvstore._hitrate lacks S3Fifo: run `make setup`"


@settings(max_examples=200, deadline=None)
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
            policy="s3fifo",
            retention_s=ret,
            time_scale=scale,
            replay_keep_tokens=3,
        )
        for h, d, s in layouts
    ]
    for cfg, got in zip(cfgs, replay(reqs, cfgs), strict=True):
        assert got == simulate(reqs, cfg)  # every field, the float ratio sum bit for bit


@pytest.mark.parametrize("key_offset", [0, 1 << 40])
def test_long_trace_with_promotions_ghosts_and_expiry(key_offset: int) -> None:
    """Long enough for the small, main and ghost queues to cycle many times over, for
    tables to grow and for retention to expire blocks in every state."""
    reqs = agent_trace(1500, seed=5, key_offset=key_offset)
    for ret in (math.inf, 72 * 3600.0, 100.0):
        cfgs = [
            SimConfig(policy="s3fifo", retention_s=ret),
            SimConfig(policy="s3fifo", ssd=Capacity(tokens=4 * 500), retention_s=ret),
            SimConfig(
                policy="s3fifo",
                hbm=Capacity(tokens=4 * 50),
                dram=Capacity(tokens=4 * 400),
                ssd=Capacity(tokens=4 * 2000),
                retention_s=ret,
            ),
            SimConfig(
                policy="s3fifo", hbm=Capacity(tokens=4), ssd=Capacity(bytes_=1), retention_s=ret
            ),
        ]
        for cfg, got in zip(cfgs, replay(reqs, cfgs, batch=5000), strict=True):
            assert got == simulate(reqs, cfg)


def test_configs_it_cannot_replay_are_refused() -> None:
    with pytest.raises(ConfigError, match="--policy s3fifo"):
        S3FifoReplay([SimConfig()])
    with pytest.raises(ConfigError, match="shares retention"):
        S3FifoReplay(
            [SimConfig(policy="s3fifo"), SimConfig(policy="s3fifo", retention_s=5.0)]
        )
    engine = S3FifoReplay([SimConfig(policy="s3fifo")])
    engine.feed(batches_of(rows_of([Request(0.0, 8, [1, 2], 4)])))
    with pytest.raises(ConfigError, match="block sizes 4 and 8"):
        engine.feed(batches_of(rows_of([Request(1.0, 8, [1], 8)])))


def _sample(tmp_path: Path) -> Path:
    reqs = agent_trace(600, seed=6)
    path = tmp_path / "trace.jsonl"
    with path.open("w") as f:
        for r in reqs:  # Mooncake lines: ms timestamps, ids of B = 4-token blocks
            ids = ", ".join(str(k) for k in r.keys)
            f.write(
                f'{{"timestamp": {int(r.time_s * 1000)}, "input_length": {len(r.keys) * 4}, '
                f'"hash_ids": [{ids}]}}\n'
            )
    return path


def test_run_s3fifo_native_and_fallback_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read natively; one ``Simulator`` per point without the module: same figures."""
    reader = open_inputs([str(_sample(tmp_path))], fmt="mooncake", block_tokens=4)
    config = SimConfig(policy="s3fifo", hbm=Capacity(tokens=4 * 30), retention_s=3600.0)
    specs = [parse_sweep("ssd=40tok..4000tok:x2"), parse_sweep("dram=100tok,1000tok")]
    native = run_s3fifo(reader, config, specs)
    monkeypatch.setattr(s3replay, "_native", None)
    assert not s3replay.native_available()
    with pytest.raises(ConfigError, match="not built"):
        S3FifoReplay([config])
    fallback = run_s3fifo(reader, config, specs)
    assert native == fallback
    base, points = native
    assert base.requests == 600 and len(points) == 9
    assert [p.tier for p in points] == ["ssd"] * 7 + ["dram"] * 2


def test_the_mooncake_trace_natively_and_per_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Mooncake trace (one namespace, 12,031 requests), three tiers with expiry and
    a DRAM sweep: the native replay equals one ``Simulator`` per point (skipped without the
    sample traces)."""
    from test_hitrate_traces import traces_dir

    from kvstore.units import parse_capacity

    path = traces_dir() / "mooncake" / "conversation_trace.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    reader = open_inputs([str(path)])
    config = SimConfig(
        hbm=parse_capacity("32GiB"),
        dram=parse_capacity("128GiB"),
        ssd=parse_capacity("1TiB"),
        policy="s3fifo",
        retention_s=600.0,
    )
    specs = [parse_sweep("dram=16GiB..1TiB:x4")]
    native = run_s3fifo(reader, config, specs)
    monkeypatch.setattr(s3replay, "_native", None)
    assert native == run_s3fifo(reader, config, specs)
    assert 0.3 < native[0].token_hit_rate < 0.4
