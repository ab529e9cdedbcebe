"""Interop: the daemon's own access-log writer, replayed by ``kvstore hitrate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.accesslog import writer as access_log  # a broken import must fail the run, not skip it
from kvstore.cli import main
from kvstore.keys import Namespace, chain_keys


def test_replay_of_a_log_written_by_the_daemon_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = Namespace("m", "r", "bfloat16", "mha", (0,), 1, 8, block_tokens=16)
    prompt = list(range(100))  # 6 full blocks, a 4-token tail
    log = access_log.ParquetAccessLog(access_log.AccessLogConfig(dir=str(tmp_path), flush_s=0.05))
    for turn, extra in enumerate([0, 0, 32]):
        tokens = prompt + list(range(1000, 1000 + extra))
        keys = chain_keys(ns, tokens)
        log.record(
            access_log.LookupRecord(
                ts_us=1_000_000 * turn,
                tenant="",
                namespace=ns.fingerprint,
                block_tokens=16,
                prompt_tokens=len(tokens),
                keys=keys,
                hit_blocks=0,
                hit_hbm=0,
                hit_dram=0,
                hit_ssd=0,
            )
        )
    log.close()
    assert main(["hitrate", "--json", str(tmp_path), "--ssd", "inf"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 3
    assert out["input_tokens"] == 100 + 100 + 132
    assert out["hit_tokens"] == 96 + 96  # turns 2 and 3 hit the 6 full blocks
