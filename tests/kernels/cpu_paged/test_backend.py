"""The ``cpu_paged`` backend: registered, the CPU default once its self-check passes, the
torch backend (with one log line) when it cannot load or the check fails."""

from __future__ import annotations

import logging

import pytest
import torch

import kernels
import kernels.cpu_paged as cpu_paged
from kernels import backend as registry
from kernels.cpu_paged import decode, prefill
from kernels.cpu_paged.selfcheck import SelfCheckResult, run_selfcheck
from tests.kernels.paged_case import TOLERANCE, dense_reference, make_case

built = pytest.mark.skipif(decode._ext is None, reason="kernels._paged_decode not built")


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch):
    """A registry with no instance of ``cpu_paged`` yet and no remembered refusal."""
    monkeypatch.delitem(registry._INSTANCES, "cpu_paged", raising=False)
    monkeypatch.setattr(registry, "_CPU_REFUSAL", [])
    yield
    registry._INSTANCES.pop("cpu_paged", None)


@built
def test_selfcheck_passes_here() -> None:
    result = run_selfcheck()
    assert result.ok, result.detail
    assert 0.0 <= result.worst_abs_error < 3e-2


@built
def test_cpu_default_is_cpu_paged(fresh_registry) -> None:
    assert "cpu_paged" in kernels.backend_names()
    assert kernels.default_backend_name("cpu") == "cpu_paged"
    assert kernels.resolve_backend(None, "cpu").name == "cpu_paged"
    with pytest.raises(kernels.BackendUnavailable, match="does not run on 'meta'"):
        kernels.resolve_backend("cpu_paged", "meta")


def test_failed_selfcheck_falls_back_to_torch_once(
        fresh_registry, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def failing() -> SelfCheckResult:
        calls.append(1)
        return SelfCheckResult(False, 1.0, "bfloat16: max |error| 1 > 0.03")

    monkeypatch.setattr(cpu_paged, "run_selfcheck", failing)
    monkeypatch.setattr(decode, "_ext", decode._ext or object())
    with caplog.at_level(logging.WARNING, logger="kernels.backend"):
        for _ in range(3):
            assert kernels.default_backend_name("cpu") == "torch"
    lines = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(lines) == 1 and "self-check" in lines[0] and "max |error|" in lines[0]
    assert len(calls) == 1  # the refusal is remembered, not re-checked per call
    with pytest.raises(kernels.BackendUnavailable, match="self-check"):
        kernels.get_backend("cpu_paged")  # asked by name it fails, never falls back


def test_unbuilt_extension_falls_back_to_torch(
        fresh_registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_ext", None)
    assert kernels.default_backend_name("cpu") == "torch"
    with pytest.raises(kernels.BackendUnavailable, match="not built"):
        kernels.get_backend("cpu_paged")


def _counted(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    seen: list[int] = []
    real = getattr(module, name)

    def counted(*a: object, **k: object) -> torch.Tensor:
        seen.append(1)
        return real(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return seen


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_and_decode_are_the_kernels(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case([40, 90], [40, 7], heads=9, kv_heads=3, head_dim=64, dtype=dtype, seed=5)
    want = dense_reference(case)
    args = (case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
            case.seq_lens, case.scale)
    assert kernels.get_backend("cpu_paged").prefill_refusal == ""
    prefilled = _counted(monkeypatch, prefill, "paged_prefill")
    ours = kernels.paged_prefill_attention(*args, backend="cpu_paged")
    assert prefilled == [1]
    assert (ours.double() - want).abs().max() <= TOLERANCE[dtype]
    decoded = _counted(monkeypatch, decode, "paged_decode")
    last = case.cu_seqlens_q[1:].long() - 1
    got = kernels.paged_decode_attention(case.q[last], case.k_pool, case.v_pool,
                                         case.block_tables, case.seq_lens, case.scale,
                                         backend="cpu_paged")
    assert decoded == [1]
    assert (got.double() - want[last]).abs().max() <= TOLERANCE[dtype]


@built
def test_float16_prefill_goes_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case([40, 90], [40, 7], heads=4, kv_heads=2, dtype=torch.float16, seed=6)
    args = (case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
            case.seq_lens, case.scale)
    prefilled = _counted(monkeypatch, prefill, "paged_prefill")
    ours = kernels.paged_prefill_attention(*args, backend="cpu_paged")
    assert prefilled == []
    assert torch.equal(ours, kernels.paged_prefill_attention(*args, backend="torch"))


@built
@pytest.mark.parametrize("why", ["unbuilt", "selfcheck"])
def test_prefill_falls_back_to_the_reference_with_one_line(
        why: str, fresh_registry, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Without a usable prefill kernel the backend still serves decode from its kernel and
    prefill from the reference, bit for bit, and says why once."""
    if why == "unbuilt":
        monkeypatch.setattr(prefill, "_ext", None)
    else:
        monkeypatch.setattr(cpu_paged, "run_prefill_selfcheck",
                            lambda: SelfCheckResult(False, 1.0, "prefill: max |error| 1"))
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_paged"):
        for _ in range(3):
            assert kernels.default_backend_name("cpu") == "cpu_paged"
    lines = [r.getMessage() for r in caplog.records if "prefill falls back" in r.getMessage()]
    assert len(lines) == 1 and ("not built" if why == "unbuilt" else "self-check") in lines[0]
    case = make_case([40, 90], [40, 7], heads=9, kv_heads=3, head_dim=64,
                     dtype=torch.bfloat16, seed=5)
    args = (case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
            case.seq_lens, case.scale)
    ours = kernels.paged_prefill_attention(*args, backend="cpu_paged")
    assert torch.equal(ours, kernels.paged_prefill_attention(*args, backend="torch"))
