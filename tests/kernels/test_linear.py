"""The prepared-weight matmul computes ``F.linear``'s bits, and follows weight changes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from kernels.linear import (
    DenseLinear,
    OneDnnPackedLinear,
    PreparedWeight,
    plain_linears,
    select_linear_kernel,
)

needs_onednn = pytest.mark.skipif(
    not isinstance(select_linear_kernel(torch.empty(2, 2, dtype=torch.bfloat16)),
                   OneDnnPackedLinear),
    reason="no oneDNN bf16 on this CPU (or KERNELS_LINEAR=dense): only F.linear runs here")


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


@needs_onednn
def test_prepared_weight_follows_in_place_writes() -> None:
    w = torch.randn(8, 16).bfloat16()
    x = torch.randn(3, 16).bfloat16()
    prepared = PreparedWeight()
    first = prepared.linear(x, w, None)
    with torch.no_grad():
        w.mul_(2)  # a loader writing new weights into the same tensor
    assert torch.equal(prepared.linear(x, w, None), F.linear(x, w))
    assert not torch.equal(first, F.linear(x, w))


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
    if isinstance(select_linear_kernel(w), OneDnnPackedLinear):
        assert outside.calls == 0  # the packed kernel is no F.linear call
    with _SeesLinear() as after:  # the switch is scoped
        prepared.linear(x, w, None)
    assert after.calls == outside.calls
