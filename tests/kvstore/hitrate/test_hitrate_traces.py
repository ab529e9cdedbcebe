"""The two figures the issue pins, on the real sample traces (skipped when absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvstore.cli import main

pytestmark = pytest.mark.traces

REPO = Path(__file__).resolve().parents[3]


def traces_dir() -> Path:
    d = Path(os.environ.get("KVSTORE_TRACES_DIR", REPO.parent / "shared" / "traces"))
    if not d.is_dir():
        pytest.skip(f"sample traces not found at {d} (set KVSTORE_TRACES_DIR)")
    return d


def hit_rate(capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    if not path.exists():
        pytest.skip(f"{path} not found")
    rc = main(["hitrate", "--json", str(path), "--hbm", "0", "--dram", "0", "--ssd", "inf"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_mooncake_conversation_trace(capsys: pytest.CaptureFixture[str]) -> None:
    out = hit_rate(capsys, traces_dir() / "mooncake" / "conversation_trace.jsonl")
    assert out["requests"] == 12031
    assert f"{100 * out['token_hit_rate']:.2f}" == "37.36"


def test_kv_cache_tester_sample_directory(capsys: pytest.CaptureFixture[str]) -> None:
    d = traces_dir() / "kv-cache-tester"
    if len(list(d.glob("*.json"))) != 20:
        pytest.skip(f"{d} does not hold the 20 sample sessions")
    out = hit_rate(capsys, d)
    assert f"{100 * out['token_hit_rate']:.2f}" == "95.71"
    assert out["tiers"]["ssd"]["hit_tokens"] == out["hit_tokens"]
