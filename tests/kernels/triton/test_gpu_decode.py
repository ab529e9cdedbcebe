"""``bench/gpu_decode.py`` at toy sizes: its cases run, agree with SDPA and report rates
(under the interpreter here, so the figures say nothing about speed)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import gpu_decode
from tests.kernels.triton.conftest import DEVICE


def test_tiny_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    assert gpu_decode.main(["--device", DEVICE, "--tiny", "--rounds", "1", "--json",
                            str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["copy_gbps_read_plus_write"] > 0
    assert len(doc["cases"]) == 2
    for case in doc["cases"]:
        assert {"triton", "sdpa", "gather+sdpa"} <= set(case["gbps"])
        assert case["kv_bytes"] == 2 * case["batch"] * case["context_tokens"] * 2 * 16 * 4
        assert all(d < 1e-4 for d in case["max_abs_diff"].values()), case
        assert case["triton_vs_copy"] > 0
        if "flashinfer" not in case["gbps"]:
            assert any("flashinfer" in note for note in case["notes"])
