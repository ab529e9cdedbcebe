"""The device the Triton tests run on and the backend under test.

``KERNELS_TEST_DEVICE`` picks it (``cuda``, ``npu``); by default ``cuda`` when present,
else the CPU through Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is
first imported, as ``tests/kernels/test_triton_interpreter.py`` does).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("KERNELS_TEST_DEVICE") or ("cuda" if torch.cuda.is_available()
                                                   else "cpu")
if DEVICE == "npu":
    import torch_npu  # noqa: F401  (registers the npu device with torch)


@pytest.fixture(scope="session")
def backend():
    from kernels.triton_backend.backend import TritonBackend, interpreting

    if DEVICE == "cpu" and not interpreting():
        pytest.fail("Triton runs on the CPU only in its interpreter: set TRITON_INTERPRET=1 "
                    "before triton is imported (tests/kernels/test_triton_interpreter.py "
                    "does), or run on a GPU")
    return TritonBackend()
