"""``bench/gpu_check.sh`` and ``bench/gpu_decode.py`` off a GPU: they refuse clearly.

What can run here of them does: the dry run of the script, and (in
``tests/kernels/triton/test_gpu_decode.py``) the benchmark's code under the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHON"] = sys.executable
    return env


def test_gpu_check_without_cuda_fails_clearly(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert "no CUDA device" in done.stderr
    assert "device none" in (tmp_path / "env.txt").read_text()
    assert not (tmp_path / "decode.json").exists()


def test_gpu_check_dry_run_lists_its_steps(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--dry-run"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "KERNELS_TEST_DEVICE=cuda" in done.stdout and "tests/kernels/triton" in done.stdout
    assert "bench.gpu_decode" in done.stdout
    env = (tmp_path / "env.txt").read_text()
    assert env.startswith("python ") and "\ntriton " in env and "\nflashinfer " in env


def test_gpu_decode_without_cuda_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.gpu_decode", "--json",
                           str(tmp_path / "d.json")], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("gpu_decode: CUDA is not available")
    assert done.stderr.count("\n") == 1
