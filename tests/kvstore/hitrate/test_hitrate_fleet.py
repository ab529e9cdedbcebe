"""``kvstore hitrate --replicas N --routing …`` through the CLI (``fleet.py``,
``fleet_report.py``): one replica is today's figures, the JSON and text sections, sweeps,
the real sample (skipped when absent) and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hitrate_files import kvct_request, write_kvct, write_mooncake_jsonl
from test_hitrate_cli import TRACE, fail, run_json
from test_hitrate_traces import traces_dir

from kvstore.cli import main
from kvstore.hitrate.routing import ROUTINGS

SIZES = ("--hbm", "1024tok", "--dram", "512tok", "--ssd", "inf")


@pytest.fixture
def moon(tmp_path: Path) -> Path:
    return write_mooncake_jsonl(tmp_path / "t.jsonl", TRACE)


@pytest.fixture
def sessions(tmp_path: Path) -> Path:
    d = tmp_path / "kvct"
    d.mkdir()
    for s in range(3):
        chain = [kvct_request(float(i), 64 * (i + 2), range(i + 2)) for i in range(4)]
        write_kvct(d / f"trace_{s}.json", chain)
    return d


def _figures(body: dict) -> dict:
    keep = ("requests", "input_tokens", "hit_tokens", "mean_request_hit_ratio", "tiers", "cost")
    return {k: body[k] for k in keep}


@pytest.mark.parametrize("which", ["moon", "sessions"])
def test_one_replica_gives_todays_figures_for_every_routing(
    capsys: pytest.CaptureFixture[str], which: str, request: pytest.FixtureRequest
) -> None:
    path = str(request.getfixturevalue(which))
    today = run_json(capsys, path, *SIZES)
    out = run_json(capsys, path, *SIZES, "--replicas", "1")
    assert set(out["routing"]) == set(ROUTINGS)
    assert _figures(out) == _figures(today)
    for body in out["routing"].values():
        assert _figures(body) == _figures(today)
        assert body["requests_per_replica"] == [today["requests"]]


def test_json_has_a_section_per_routing(capsys: pytest.CaptureFixture[str], sessions: Path) -> None:
    out = run_json(
        capsys, str(sessions), *SIZES, "--replicas", "2", "--routing", "sticky,round_robin"
    )
    assert list(out["routing"]) == ["sticky", "round_robin"]
    assert out["replicas"] == 2 and out["dram_per_replica"] is False
    for body in out["routing"].values():
        assert sum(body["requests_per_replica"]) == 12
        assert sum(body["by_tier"].values()) == pytest.approx(1.0)
        assert set(body["by_tier"]) == {"hbm", "dram", "ssd", "miss"}
    # Sticky keeps each session on one replica: every request but the first of each
    # session hits its whole previous chain in HBM.
    assert out["routing"]["sticky"]["requests_per_replica"] == [8, 4]
    assert out["routing"]["sticky"]["tiers"]["hbm"]["hit_blocks"] == 3 * (2 + 3 + 4)
    assert out["hit_tokens"] == out["routing"]["sticky"]["hit_tokens"]  # top level: the first
    benefit = out["store_benefit"]
    assert benefit["routing"] == "round_robin"
    assert benefit["with_store"]["hit_tokens"] >= benefit["pools_alone"]["hit_tokens"]
    rr = out["routing"]["round_robin"]
    for k in ("hit_tokens", "token_hit_rate", "mean_request_hit_ratio"):
        assert benefit["with_store"][k] == rr[k]
    assert benefit["pools_alone"]["tiers"]["ssd"]["present"] is False


def test_consistent_hash_is_the_same_every_run(
    capsys: pytest.CaptureFixture[str], sessions: Path
) -> None:
    argv = (str(sessions), "--hbm", "256tok", "--replicas", "3", "--routing", "consistent_hash")
    assert run_json(capsys, *argv) == run_json(capsys, *argv)


def test_text_table_and_store_benefit(capsys: pytest.CaptureFixture[str], moon: Path) -> None:
    assert main(["hitrate", str(moon), *SIZES, "--replicas", "2"]) == 0
    text = capsys.readouterr().out
    assert "replicas 2: hbm" in text and "dram 512tok shared" in text
    for name in ROUTINGS:
        assert name in text
    assert "shared store, round_robin: replica pools alone" in text


def test_sweep_per_routing(capsys: pytest.CaptureFixture[str], sessions: Path) -> None:
    argv = (str(sessions), "--ssd", "0", "--replicas", "2", "--routing", "round_robin,sticky")
    out = run_json(capsys, *argv, "--sweep", "hbm=128tok,1024tok")
    for name in ("round_robin", "sticky"):
        sweep = out["routing"][name]["sweep"]
        assert [p["capacity"] for p in sweep] == ["128tok", "1024tok"]
        assert sweep[0]["hit_tokens"] <= sweep[1]["hit_tokens"]
        # Each point is the replay at that capacity.
        alone = run_json(capsys, *argv, "--hbm", sweep[1]["capacity"])
        assert alone["routing"][name]["hit_tokens"] == sweep[1]["hit_tokens"]
    assert out["store_benefit"] is None  # no dram, no ssd: no store
    assert main(["hitrate", *argv, "--sweep", "hbm=128tok,1024tok"]) == 0
    assert "sweep (replay, sticky)" in capsys.readouterr().out


def test_dram_per_replica(capsys: pytest.CaptureFixture[str], sessions: Path) -> None:
    argv = (str(sessions), "--dram", "1024tok", "--ssd", "0", "--replicas", "2")
    shared = run_json(capsys, *argv, "--routing", "round_robin")
    own = run_json(capsys, *argv, "--routing", "round_robin", "--dram-per-replica")
    assert own["dram_per_replica"] is True
    assert own["hit_tokens"] < shared["hit_tokens"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--replicas", "0"), "--replicas must be at least 1"),
        (("--replicas", "-2"), "--replicas must be at least 1"),
        (("--replicas", "two"), "--replicas: expected a number"),
        (("--replicas", "2", "--routing", "random"), "unknown routing 'random'"),
        (("--replicas", "2", "--routing", ","), "no routing"),
        (("--dram-per-replica",), "--dram-per-replica needs --replicas"),
        (("--routing", "sticky"), "--routing needs --replicas"),
        (("--replicas", "2", "--sample", "0.5"), "--sample does not apply with --replicas"),
        (("--replicas", "2", "--max-memory", "1GiB"), "--max-memory does not apply"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], moon: Path, argv: tuple[str, ...], message: str
) -> None:
    assert message in fail(capsys, str(moon), *argv)


@pytest.mark.traces
def test_kv_cache_tester_sample_two_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    d = traces_dir() / "kv-cache-tester"
    if len(list(d.glob("*.json"))) != 20:
        pytest.skip(f"{d} does not hold the 20 sample sessions")
    rc = main(["hitrate", "--json", str(d), "--hbm", "256MiB", "--replicas", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    # The store holds everything (ssd inf): every routing reaches the single engine's 95.71 %.
    for body in out["routing"].values():
        assert f"{100 * body['token_hit_rate']:.2f}" == "95.71"
    rr, sticky = out["routing"]["round_robin"], out["routing"]["sticky"]
    assert sticky["tiers"]["hbm"]["hit_tokens"] >= rr["tiers"]["hbm"]["hit_tokens"]
    b = out["store_benefit"]
    assert b["with_store"]["hit_tokens"] > b["pools_alone"]["hit_tokens"]


def test_config_file_takes_the_replica_flags(
    capsys: pytest.CaptureFixture[str], sessions: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "r.toml"
    cfg.write_text(
        'replicas = 2\nrouting = ["sticky", "round_robin"]\ndram-per-replica = true\n'
        'dram = "1024tok"\n'
    )
    out = run_json(capsys, str(sessions), "--config", str(cfg))
    assert out["replicas"] == 2 and out["dram_per_replica"] is True
    assert list(out["routing"]) == ["sticky", "round_robin"]
