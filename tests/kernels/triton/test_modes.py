"""How the Triton backend is found and where it refuses to run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernels
from kernels import backend as kernel_backend
from kernels.triton_backend.backend import TritonBackend, interpreting
from tests.kernels.triton.conftest import DEVICE

REPO = Path(__file__).resolve().parents[3]


def test_registry_serves_triton_and_the_default_follows_the_device() -> None:
    assert "triton" in kernels.backend_names()
    assert isinstance(kernels.get_backend("triton"), TritonBackend)
    assert kernels.default_backend_name("cpu") in ("cpu_paged", "torch")  # never triton
    if DEVICE != "cpu":
        assert kernels.default_backend_name(DEVICE) == "triton"


@pytest.mark.parametrize("device", [
    "cuda",
    pytest.param("npu", marks=pytest.mark.skipif(
        importlib.util.find_spec("torch_npu") is None,
        reason="torch knows the npu device only once torch_npu is imported")),
])
def test_gpus_and_npus_default_to_triton_while_it_loads(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine passes ``attention_backend=None`` unless ``--attention-backend`` is given:
    a GPU or NPU then gets ``triton``, the CPU ``cpu_paged`` (``torch`` when that is not
    built), and a GPU ``torch`` only when
    Triton cannot load there (asking for ``triton`` by name then fails, never falls back)."""
    assert kernels.default_backend_name(device) == "triton"
    assert kernels.resolve_backend(None, "cpu").name in ("cpu_paged", "torch")
    entry = kernel_backend._REGISTRY["triton"]
    monkeypatch.setitem(kernel_backend._REGISTRY, "triton", kernels.BackendEntry(
        "kernels.no_such_module", entry.cls, entry.device_types))
    monkeypatch.delitem(kernel_backend._INSTANCES, "triton", raising=False)
    assert kernels.default_backend_name(device) == "torch"
    with pytest.raises(kernels.BackendUnavailable, match="cannot load"):
        kernels.resolve_backend("triton", device)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter is how the CPU runs Triton")
def test_cpu_tensors_need_the_interpreter() -> None:
    """Here Triton runs interpreted; a process that imported it for the compiler refuses
    CPU tensors with a message saying what to do (instead of failing inside Triton)."""
    assert interpreting()
    code = (
        "import torch, kernels\n"
        "from tests.kernels.paged_case import make_case\n"
        "c = make_case([20], [1])\n"
        "try:\n"
        "    kernels.paged_decode_attention(c.q, c.k_pool, c.v_pool, c.block_tables,\n"
        "                                   c.seq_lens, c.scale, backend='triton')\n"
        "except kernels.BackendUnavailable as exc:\n"
        "    print('refused:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "TRITON_INTERPRET=1" in done.stdout
