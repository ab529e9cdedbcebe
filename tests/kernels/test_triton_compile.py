"""The Triton kernels compile for SM80, SM90 and SM100 (no GPU needed: Triton's wheel
ships ``ptxas``), within each target's shared memory, for the shapes the backend plans.

Run in a child process without ``TRITON_INTERPRET`` so Triton is imported for its
compiler whatever this process did. What compiles here has not necessarily *run* on
those GPUs (``kernels/README.md`` says what has).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ptxas_present() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _ptxas_present(), reason="triton with its NVIDIA backend (ptxas) "
                    "is not installed")
@pytest.mark.parametrize(("arch", "dtype", "head_dim", "index"), [
    ("80", "fp16", "64", "i32"),
    ("90", "bf16", "128", "i32"),
    ("100", "bf16", "128", "i32"),
    ("90", "fp32", "256", "i64"),
])
def test_kernels_compile_for_nvidia_targets(arch: str, dtype: str, head_dim: str,
                                            index: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9 warns when it is left unset
    done = subprocess.run(
        [sys.executable, "-m", "kernels.triton_backend.compile_check", "--arch", arch,
         "--dtype", dtype, "--head-dim", head_dim, "--index", index],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.count(f"sm{arch} ") == 4  # attention ×2, merge, write_slots
