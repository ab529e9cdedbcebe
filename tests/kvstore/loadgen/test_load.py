"""Replays into the embedded store: measured equals the model at concurrency 1, the
prediction equals ``kvstore hitrate``'s, and wrong bytes are caught and named."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore.cli import main
from kvstore.keys import Key, Namespace
from kvstore.loadgen.load import LoadConfig, LoadRun
from kvstore.loadgen.session import StoreSession
from kvstore.tier import KVStore
from tests.delegating import DelegatingStore
from tests.kvstore.loadgen.conftest import RunLoad

HITRATE_KEYS = (
    "requests",
    "input_tokens",
    "hit_tokens",
    "token_hit_rate",
    "mean_request_hit_ratio",
    "computed_tokens",
    "computed_tokens_with_replay",
    "tiers",
)


def hitrate_json(capsys: pytest.CaptureFixture[str], trace: Path, dram_blocks: int, b: int) -> dict:
    args = [
        "hitrate",
        "--json",
        str(trace),
        "--hbm",
        "0",
        "--dram",
        f"{dram_blocks * b}tok",
        "--ssd",
        "0",
        "--retention",
        "inf",
    ]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dram_bytes", [16 << 20, 256 << 10], ids=["holds", "evicts"])
def test_concurrency_one_equals_the_model_exactly(
    embedded_run: RunLoad, conv_trace: Path, dram_bytes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    load = embedded_run(conv_trace, dram_bytes=dram_bytes, verify=True)
    body = load.report_.to_json()
    assert body["wrong_bytes"] == 0 and body["errors"] == {}
    cap = body["tiers"]["dram"]["capacity_blocks"]
    unique = len({k for tr in load.items() for k in tr.keys})
    if dram_bytes < 1 << 20:
        assert cap < unique / 2  # the tier really forces evictions
    else:
        assert cap > unique
    for k in HITRATE_KEYS:
        assert body[k] == body["predicted"][k], k
    assert body["hit_tokens"] > 0 and body["gap_points"] == 0
    # The prediction is the hit-rate tool's answer for the same capacity.
    ref = hitrate_json(capsys, conv_trace, cap, 512)
    for k in HITRATE_KEYS:
        assert body["predicted"][k] == ref[k], k
    assert set(ref) <= set(body)  # every key of hitrate --json is there


def test_session_files_do_not_share_blocks(
    embedded_run: RunLoad, sessions_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load = embedded_run(sessions_dir, verify=True)
    body = load.report_.to_json()
    assert body["load"]["namespaces"] == 3
    for k in HITRATE_KEYS:
        assert body[k] == body["predicted"][k], k
    ref = hitrate_json(capsys, sessions_dir, body["tiers"]["dram"]["capacity_blocks"], 64)
    assert body["hit_tokens"] == ref["hit_tokens"]
    # Every session's first turn misses although all files use the same local ids.
    first_turns = [tr for tr in load.items() if tr.request.time_s < 1.0]
    assert len(first_turns) == 3
    assert len({tr.keys[0] for tr in first_turns}) == 3


@pytest.mark.parametrize("streams", ["pool", "namespace"])
def test_concurrent_streams_verify_clean(
    embedded_run: RunLoad, conv_trace: Path, sessions_dir: Path, streams: str
) -> None:
    trace = conv_trace if streams == "pool" else sessions_dir
    load = embedded_run(trace, verify=True, concurrency=4, streams=streams)
    body = load.report_.to_json()
    assert body["wrong_bytes"] == 0 and body["errors"] == {}
    assert body["requests"] == body["predicted"]["requests"]
    assert body["input_tokens"] == body["predicted"]["input_tokens"]
    assert body["latency"]["lookup"]["count"] == body["requests"]
    assert 0 < body["hit_tokens"] <= body["input_tokens"]


def test_a_slice_replays_the_first_requests(embedded_run: RunLoad, conv_trace: Path) -> None:
    load = embedded_run(conv_trace, max_requests=10)
    body = load.report_.to_json()
    assert body["requests"] == body["predicted"]["requests"] == 10


class FlipOneByte(DelegatingStore):
    """The real embedded store with one byte flipped in the ``nth`` non-empty read."""

    def __init__(self, inner: KVStore, nth: int = 3) -> None:
        super().__init__(inner)
        self.nth, self.reads = nth, 0

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        got = self.inner.get_into(ns, keys, dst, timeout_s=timeout_s, checksums=checksums)
        if got:
            self.reads += 1
            if self.reads == self.nth:
                np.asarray(dst).reshape(-1)[5] ^= 0x40
        return got


def test_one_wrong_byte_is_counted_and_named(embedded_run: RunLoad, conv_trace: Path) -> None:
    stderr = io.StringIO()
    from kvstore.embedded import open_embedded

    store = FlipOneByte(open_embedded(16 << 20))
    try:
        load = LoadRun(
            LoadConfig(inputs=(str(conv_trace),), bytes_per_token=4, verify=True),
            StoreSession(lambda: store, reopenable=False),
            stderr=stderr,
        )
        body = load.run().to_json()
    finally:
        store.close()
    assert body["wrong_bytes"] == 1 and body["wrong_blocks"] == 1
    (w,) = body["wrong_keys"]
    assert w["block"] == 0 and w["first_offset"] == 5
    assert f"WRONG BYTES: key {w['key']}" in stderr.getvalue()


def test_without_verify_nothing_is_checked(conv_trace: Path) -> None:
    from kvstore.embedded import open_embedded

    store = FlipOneByte(open_embedded(16 << 20))
    try:
        load = LoadRun(
            LoadConfig(inputs=(str(conv_trace),), bytes_per_token=4),
            StoreSession(lambda: store, reopenable=False),
        )
        assert load.run().wrong_bytes == 0
    finally:
        store.close()


def test_cli_exits_1_on_wrong_bytes(
    conv_trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstore.embedded import open_embedded
    from kvstore.loadgen import cli

    store = FlipOneByte(open_embedded(16 << 20))
    monkeypatch.setattr(
        cli, "_open_session", lambda args, t: StoreSession(lambda: store, reopenable=False)
    )
    rc = main(["loadgen", "--json", str(conv_trace), "--verify", "--bytes-per-token", "4"])
    out, err = capsys.readouterr()
    assert rc == 1
    body = json.loads(out)
    assert body["wrong_bytes"] == 1
    assert "FAILED: 1 wrong bytes" in err and body["wrong_keys"][0]["key"] in err
