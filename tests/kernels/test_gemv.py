"""``bf16gemv``: the packed skinny GEMM against the exact product, batch invariance, the
packed layout, and both code paths (AVX512-BF16 where the CPU has it, portable C)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from kernels import gemv

pytestmark = pytest.mark.skipif(not gemv.built(), reason=f"kernels._gemv is not built: "
                                f"{gemv.IMPORT_ERROR}")

PATHS = [False, pytest.param(True, id="portable")]
needs_fast = pytest.mark.skipif(not gemv.has_fast(), reason="no AVX512-BF16 on this CPU")


def _case(m: int, n: int, k: int, bias: bool, strided: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    # Strided rows: a column slice of a wider matrix, or a transposed one (column stride ≠ 1).
    x = (torch.randn(k, m, generator=g).bfloat16().t() if strided
         else torch.randn(m, k + 3, generator=g).bfloat16()[:, 1:k + 1])
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b


@pytest.mark.parametrize("portable", PATHS)
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 16), n=st.integers(1, 200), k=st.integers(1, 300),
       bias=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_exact_product_within_bf16_rounding(portable: bool, m: int, n: int, k: int,
                                                    bias: bool, strided: bool,
                                                    seed: int) -> None:
    x, w, b = _case(m, n, k, bias, strided, seed)
    got = gemv.linear(x, gemv.pack(w), b, portable=portable)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert gemv.error_ratio(got, x, w, b) <= 1.0
    # And F.linear's own bf16 result is no closer than that bound allows either: the two
    # differ by summation order only (most elements are bitwise equal).
    assert (got == F.linear(x, w, b)).float().mean() > 0.9


@settings(max_examples=10, deadline=None)
@given(m=st.integers(17, 70), n=st.integers(1, 130), k=st.integers(1, 200),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_prefill_sized_rows_too(m: int, n: int, k: int, bias: bool, seed: int) -> None:
    x, w, b = _case(m, n, k, bias, False, seed)
    assert gemv.error_ratio(gemv.linear(x, gemv.pack(w), b), x, w, b) <= 1.0


@pytest.mark.parametrize("portable", PATHS)
@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 40), n=st.integers(1, 150), k=st.integers(1, 200),
       seed=st.integers(0, 2**16))
def test_a_rows_bits_depend_on_neither_batch_nor_threads(portable: bool, m: int, n: int,
                                                         k: int, seed: int) -> None:
    """Batch-invariant: each row computed alone, inside any batch (decode's ≤ 16 rows and a
    prefill's many), on 1 or 2 threads, gives the same bits."""
    x, w, b = _case(m, n, k, True, False, seed)
    packed = gemv.pack(w)
    together = gemv.linear(x, packed, b, portable=portable)
    one_thread = gemv.linear(x, packed, b, threads=1, portable=portable)
    assert torch.equal(together, one_thread)
    for r in {0, m // 2, m - 1}:
        assert torch.equal(gemv.linear(x[r:r + 1], packed, b, portable=portable), together[r:r + 1])
        assert torch.equal(gemv.linear(x[r:], packed, b, portable=portable), together[r:])


@needs_fast
@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 100), k=st.integers(1, 700),
       seed=st.integers(0, 2**16))
def test_both_paths_agree_on_normal_numbers(m: int, n: int, k: int, seed: int) -> None:
    """The same sums in the same order: the AVX512-BF16 and portable paths differ only where
    the hardware flushes subnormals, which random normal inputs never reach."""
    x, w, b = _case(m, n, k, True, False, seed)
    packed = gemv.pack(w)
    assert torch.equal(gemv.linear(x, packed, b), gemv.linear(x, packed, b, portable=True))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(1, 40))
def test_pack_layout(n: int, k: int) -> None:
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k).bfloat16()
    packed = gemv.pack(w)
    blocks, pairs = -(-n // 16), -(-k // 2)
    assert packed.data.shape == (blocks, pairs, 16, 2) and packed.data.is_contiguous()
    for col, kk in ((0, 0), (n - 1, k - 1), (n // 2, k // 2)):
        assert packed.data[col // 16, kk // 2, col % 16, kk % 2] == w[col, kk]
    # Padding is zero, so the padded columns and K contribute nothing.
    assert float(packed.data.float().sum()) == float(w.float().sum())


def test_empty_rows_and_bad_width() -> None:
    packed = gemv.pack(torch.randn(5, 8).bfloat16())
    assert gemv.linear(torch.empty(0, 8, dtype=torch.bfloat16), packed, None).shape == (0, 5)
    with pytest.raises(ValueError, match="features"):
        gemv.linear(torch.randn(2, 7).bfloat16(), packed, None)


def test_selfcheck_passes_here() -> None:
    result = gemv.run_selfcheck()
    assert result.ok, result.detail
    assert 0 < result.worst_error_ratio <= 1


def test_error_ratio_catches_a_wrong_result() -> None:
    x, w, b = _case(3, 20, 30, True, False, 0)
    right = F.linear(x.float(), w.float(), b.float())
    assert gemv.error_ratio(right.bfloat16(), x, w, b) <= 1
    wrong = right.clone()
    wrong[1, 7] += 0.05 * right.abs().max()
    assert gemv.error_ratio(wrong.bfloat16(), x, w, b) > 1


@pytest.mark.parametrize("m", range(1, 21))
def test_every_tile_shape_and_k_chunk(m: int) -> None:
    """Each row count 1–20 (one group of ≤ 8 rows, two groups sharing K chunks at 9–16, groups
    of 8 beyond) over 1–9 blocks (every remainder of a tile of up to 8 blocks), K over several
    chunks of 64 pairs with a ragged last one: right on the AVX512-BF16 path, the portable
    path's bits, and each row's bits alone."""
    for blocks in range(1, 10):
        x, w, b = _case(m, 16 * blocks - (blocks % 3), 2 * 64 * 2 + 37, True, False, m * 10 + blocks)
        packed = gemv.pack(w)
        got = gemv.linear(x, packed, b, threads=1)
        assert gemv.error_ratio(got, x, w, b) <= 1.0, blocks
        if gemv.has_fast():
            assert torch.equal(got, gemv.linear(x, packed, b, threads=1, portable=True)), blocks
        assert torch.equal(gemv.linear(x[m - 1:], packed, b, threads=1), got[m - 1:]), blocks
