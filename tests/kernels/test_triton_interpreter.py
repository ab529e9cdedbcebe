"""Runs the Triton tests (``tests/kernels/triton``) in Triton's interpreter, on the CPU.

The interpreter is chosen by ``TRITON_INTERPRET=1`` when Triton is first imported, once
per process, so the tests run in a child pytest started with it: nothing depends on what
this process imported before, and the variable reaches no other test. With a GPU the
tests are collected directly instead (see ``conftest.py``) and this one is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.conftest import HAS_TRITON, INTERPRETER_CHILD, ON_DEVICE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(ON_DEVICE or INTERPRETER_CHILD,
                    reason="the Triton tests are collected directly in this process")
@pytest.mark.timeout(1200)
def test_triton_kernels_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5",
         "tests/kernels/triton"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1100,
    )
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-4000:]
