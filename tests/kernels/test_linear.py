"""The prepared-weight matmul: oneDNN's computes ``F.linear``'s bits, ``bf16gemv`` the exact
product within bf16 rounding; the kernel each weight gets, and weight changes followed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from kernels import gemv
from kernels.linear import (
    Bf16GemvLinear,
    DenseLinear,
    OneDnnPackedLinear,
    PreparedWeight,
    _onednn_bf16,
    plain_linears,
    select_linear_kernel,
)

needs_onednn = pytest.mark.skipif(not _onednn_bf16(),
                                  reason="no oneDNN bf16 on this CPU: only F.linear runs here")
needs_gemv_default = pytest.mark.skipif(
    not gemv.usable_as_default(),
    reason="bf16gemv is not the default here (not built, or no AVX512-BF16)")
BF16 = torch.empty(2, 2, dtype=torch.bfloat16)


@needs_onednn
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), k=st.integers(1, 300), n=st.integers(1, 300),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_onednn_packed_equals_f_linear(rows: int, k: int, n: int, bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    kernel = OneDnnPackedLinear()
    assert torch.equal(kernel.apply(x, kernel.prepare(w), b), F.linear(x, w, b))


@pytest.mark.parametrize("kernel", ["onednn", "bf16gemv"])
def test_prepared_weight_follows_in_place_writes(kernel: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELS_LINEAR", kernel)
    w = torch.randn(8, 16).bfloat16()
    x = torch.randn(3, 16).bfloat16()
    prepared = PreparedWeight()
    first = prepared.linear(x, w, None)
    with torch.no_grad():
        w.mul_(2)  # a loader writing new weights into the same tensor (exact in bf16)
    assert torch.equal(prepared.linear(x, w, None), first * 2)
    assert not torch.equal(first, prepared.linear(x, w, None))


@needs_gemv_default
def test_bf16gemv_is_the_cpu_default_and_each_kernel_can_be_forced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(select_linear_kernel(BF16), Bf16GemvLinear)
    for name, cls in (("dense", DenseLinear), ("onednn", OneDnnPackedLinear),
                      ("bf16gemv", Bf16GemvLinear)):
        monkeypatch.setenv("KERNELS_LINEAR", name)
        assert isinstance(select_linear_kernel(BF16), cls)
    # A forced kernel that cannot run on this weight (float32) gives F.linear.
    assert isinstance(select_linear_kernel(torch.empty(2, 2)), DenseLinear)


@needs_onednn
def test_a_failed_gemv_selfcheck_keeps_onednn(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("KERNELS_LINEAR", raising=False)
    monkeypatch.setattr(gemv, "has_fast", lambda: True)
    monkeypatch.setattr(gemv, "run_selfcheck",
                        lambda: gemv.SelfCheckResult(False, 9.0, "m=1: made up"))
    gemv.usable_as_default.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="kernels.gemv"):
            assert isinstance(select_linear_kernel(BF16), OneDnnPackedLinear)
            assert isinstance(select_linear_kernel(BF16), OneDnnPackedLinear)
        assert [r.message for r in caplog.records].count(
            "bf16gemv failed its self-check, oneDNN stays the default: m=1: made up") == 1
    finally:
        gemv.usable_as_default.cache_clear()


@pytest.mark.skipif(not gemv.built(), reason="kernels._gemv is not built")
@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 20), k=st.integers(1, 200), n=st.integers(1, 200),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_bf16gemv_kernel_matches_the_exact_product(rows: int, k: int, n: int, bias: bool,
                                                  seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    kernel = Bf16GemvLinear()
    assert gemv.error_ratio(kernel.apply(x, kernel.prepare(w), b), x, w, b) <= 1.0


def test_float32_and_forced_dense_use_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(select_linear_kernel(torch.empty(2, 2)), DenseLinear)
    monkeypatch.setenv("KERNELS_LINEAR", "dense")
    assert isinstance(select_linear_kernel(torch.empty(2, 2, dtype=torch.bfloat16)),
                      DenseLinear)
    w, x = torch.randn(4, 6), torch.randn(2, 6)
    assert torch.equal(PreparedWeight().linear(x, w, None), F.linear(x, w))


class _SeesLinear(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is F.linear:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_plain_linears_hands_every_product_to_f_linear() -> None:
    """Batch-invariant numerics intercepts ``F.linear``; a prepared oneDNN weight would
    bypass it (and a row's bits would follow its batch) unless ``plain_linears`` is on."""
    w = torch.randn(64, 32).bfloat16()
    x = torch.randn(3, 32).bfloat16()
    prepared = PreparedWeight()
    prepared.linear(x, w, None)  # prepared for the fast kernel first
    outside = _SeesLinear()
    with outside:
        prepared.linear(x, w, None)
    inside = _SeesLinear()
    with plain_linears(), inside:
        out = prepared.linear(x, w, None)
    assert inside.calls == 1 and torch.equal(out, F.linear(x, w))
    if not isinstance(select_linear_kernel(w), DenseLinear):
        assert outside.calls == 0  # a packed kernel is no F.linear call
    with _SeesLinear() as after:  # the switch is scoped
        prepared.linear(x, w, None)
    assert after.calls == outside.calls
