"""``kvstore hitrate`` at scale through the CLI: --exact / --sample / --max-memory, the
one-pass figures against the simulator on real traces, and the bad inputs of issue #35."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hitrate_files import kvct_request, write_kvct, write_mooncake_jsonl, write_mooncake_parquet
from test_hitrate_cli import TRACE, fail, run_json

from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.readers import open_inputs
from kvstore.hitrate.simulator import Simulator
from kvstore.hitrate.sweep import parse_sweep
from kvstore.units import Capacity, parse_capacity

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_mooncake_jsonl(tmp_path / "t.jsonl", TRACE)


def test_exact_is_the_default_and_says_so(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    plain = run_json(capsys, str(trace))
    assert run_json(capsys, str(trace), "--exact") == plain
    assert "method" not in plain  # exact output keeps its shape (loadgen mirrors its keys)
    accesses = sum(len(r[2]) for r in TRACE)
    assert f"method  exact (one pass, {accesses} block accesses)" in main_text(capsys, str(trace))


def test_sampled_run_states_rate_and_bound(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    out = run_json(capsys, str(trace), "--sample", "0.5", "--sweep", "ssd=1MiB,1GiB")
    assert out["method"]["name"] == "sampled"
    assert out["method"]["sample_rate"] == 0.5
    assert out["method"]["error_bound_points"] >= 0
    assert all("error_bound_points" in p for p in out["sweep"])
    assert main_text(capsys, str(trace), "--sample", "0.5").count("sampled (SHARDS) at rate 0.5")


def main_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from kvstore.cli import main

    assert main(["hitrate", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("rate", ["0", "1.5", "-0.1", "nan", "x"])
def test_bad_sample_rates(capsys: pytest.CaptureFixture[str], trace: Path, rate: str) -> None:
    assert "--sample" in fail(capsys, str(trace), "--sample", rate)


def test_sample_and_exact_and_policy(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    with pytest.raises(SystemExit) as e:  # argparse: mutually exclusive
        main_text(capsys, str(trace), "--sample", "0.1", "--exact")
    assert e.value.code == 2
    capsys.readouterr()
    assert "--policy lru" in fail(capsys, str(trace), "--sample", "0.1", "--policy", "s3fifo")
    line = fail(capsys, str(trace), "--max-memory", "1GiB", "--policy", "s3fifo")
    assert "--max-memory needs --policy lru" in line


def test_max_memory_refuses_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = [(i, 64 * 500, range(i * 1_000_000, i * 1_000_000 + 500)) for i in range(200)]
    big = write_mooncake_jsonl(tmp_path / "big.jsonl", rows)
    err = fail(capsys, str(big), "--max-memory", "256KiB")
    assert "--max-memory" in err and "--sample" in err
    assert "--max-memory" in fail(capsys, str(big), "--max-memory", "inf")
    assert run_json(capsys, str(big), "--max-memory", "1GiB")["requests"] == 200


def test_truncated_json_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "cut.jsonl"
    p.write_bytes(b'{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n{"timestamp": 1, "inp')
    err = fail(capsys, str(p))
    assert f"{p}:2:" in err and "invalid JSON" in err


def test_decreasing_timestamps(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows = [(0, 5, [1]), (2000, 5, [1]), (1000, 5, [1])]
    p = write_mooncake_jsonl(tmp_path / "back.jsonl", rows)
    err = fail(capsys, str(p))
    assert f"{p}:3:" in err and "time order" in err
    q = write_mooncake_parquet(tmp_path / "back.parquet", rows)
    err = fail(capsys, str(q))
    assert f"{q}:row 3:" in err and "time order" in err


def test_parquet_of_another_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "other.parquet"
    pq.write_table(pa.table({"user": ["a"], "latency_ms": [3.5]}), p)
    err = fail(capsys, str(p))
    assert str(p) in err and "neither an access log nor Mooncake" in err


def test_kv_cache_tester_ids_split_out_keep_their_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Long lists go through the native splitter; a float among them is left for json, and
    # the error still names the JSON path.
    ok = list(range(40))
    bad = [*range(20), 1.5, *range(20)]
    reqs = [kvct_request(0, 64 * 40, ok), kvct_request(1, 64 * 41, bad)]
    p = write_kvct(tmp_path / "s.json", reqs)
    err = fail(capsys, str(p))
    assert f"{p}:requests[1]:" in err and "list of integers" in err


def test_kv_cache_tester_sessions_equal_the_simulator(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = [kvct_request(t, 64 * (20 + 5 * t), range(20 + 5 * t)) for t in range(6)]
    sub = kvct_request(2.5, 64 * 30, range(30), requests=[kvct_request(2.5, 64 * 3, [0, 1, 2])])
    b = [kvct_request(0.5 * t, 64 * 12 + 7, range(12)) for t in range(8)] + [sub]
    d = tmp_path / "kvct"
    d.mkdir()
    write_kvct(d / "a.json", a)
    write_kvct(d / "b.json", b)
    write_kvct(d / "c.json", [kvct_request(1, 64 * 3, [2**45, 3, -1])])  # hashed ids
    for argv in ([], ["--ssd", "2000tok"], ["--ssd", "64tok", "--dram", "640tok"]):
        got = run_json(capsys, str(d), *argv)
        cfg = SimConfig(ssd=_cap(argv, "--ssd", "inf"), dram=_cap(argv, "--dram", "0"))
        sim = Simulator(cfg)
        sim.feed(open_inputs([str(d)]).requests())
        want = sim.result().to_dict()
        assert subset(got, want) == want
        assert got["requests"] == 17


def subset(got: dict, want: dict) -> dict:
    """``got`` restricted to ``want``'s keys, nested (the report adds fields)."""
    return {k: subset(got[k], v) if isinstance(v, dict) else got[k] for k, v in want.items()}


def _cap(argv: list[str], flag: str, default: str) -> Capacity:
    return parse_capacity(argv[argv.index(flag) + 1] if flag in argv else default)


def traces_dir() -> Path:
    d = Path(os.environ.get("KVSTORE_TRACES_DIR", REPO.parent / "shared" / "traces"))
    if not d.is_dir():
        pytest.skip(f"sample traces not found at {d} (set KVSTORE_TRACES_DIR)")
    return d


@pytest.mark.traces
@pytest.mark.parametrize(
    ("name", "sweep"),
    [
        ("mooncake/conversation_trace.jsonl", "ssd=64MiB..64GiB:x8"),
        ("kv-cache-tester", "ssd=256MiB..64GiB:x8"),
    ],
)
def test_real_traces_sweep_equals_one_replay_per_point(
    capsys: pytest.CaptureFixture[str], name: str, sweep: str
) -> None:
    path = traces_dir() / name
    if not path.exists():
        pytest.skip(f"{path} not found")
    out = run_json(capsys, str(path), "--sweep", sweep)
    reqs = list(open_inputs([str(path)]).requests())
    for point, cap in zip(out["sweep"], parse_sweep(sweep).points, strict=True):
        sim = Simulator(SimConfig(ssd=cap))
        sim.feed(reqs)
        want = sim.result().to_dict()
        assert subset(point, want) == want  # every figure, exactly
