"""The C paged-prefill kernel against the dense contract and the torch reference.

Random shuffled pools (a kernel that ignores the block table reads the wrong keys), ragged
chunks (one-token and empty ones included) after cached prefixes, block sizes, GQA ratios,
head dims (64 and 256 take the AVX-512 BF16 path in bfloat16 where the CPU has it; 16 and
80 never do), both dtypes, windows and ``kv_start``; both of the kernel's paths; strided
queries and block tables.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.cpu_paged import prefill
from kernels.torch_ref.attention import paged_prefill as reference_prefill
from tests.kernels.paged_case import TOLERANCE, PagedCase, dense_reference, make_case

pytestmark = pytest.mark.skipif(prefill._ext is None, reason="kernels._paged_prefill not built")
PATHS = [prefill.PATH_BEST, prefill.PATH_PORTABLE]


@st.composite
def prefill_cases(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 4))
    q_lens = [draw(st.one_of(st.just(1), st.integers(0, 130))) for _ in range(batch)]
    cached = [draw(st.one_of(st.just(0), st.integers(0, 300))) for _ in range(batch)]
    seq_lens = [max(1, q + c) for q, c in zip(q_lens, cached, strict=True)]
    heads, kv_heads = draw(st.sampled_from([(1, 1), (4, 2), (9, 3), (8, 2), (6, 1),
                                            (16, 1), (4, 1)]))
    kv_starts = None
    if draw(st.booleans()):  # the checks' rule: every query sees at least itself
        kv_starts = [draw(st.integers(0, s - q)) if s > q else 0
                     for s, q in zip(seq_lens, q_lens, strict=True)]
    return dict(
        seq_lens=seq_lens,
        q_lens=q_lens,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([16, 64, 80, 256])),
        block_tokens=draw(st.sampled_from([1, 16, 48, 64])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        window=draw(st.one_of(st.none(), st.integers(1, 200))),
        kv_starts=kv_starts,
        seed=draw(st.integers(0, 2**16)),
    )


def _run(case: PagedCase, path: int = prefill.PATH_BEST, tiles: int = 0) -> torch.Tensor:
    return prefill.paged_prefill(case.q, case.k_pool, case.v_pool, case.cu_seqlens_q,
                                 case.block_tables, case.seq_lens, case.scale, case.window,
                                 case.kv_start, path=path, tiles_per_item=tiles)


def _reference(case: PagedCase) -> torch.Tensor:
    return reference_prefill(case.q, case.k_pool, case.v_pool, case.cu_seqlens_q,
                             case.block_tables, case.seq_lens, case.scale, case.window,
                             case.kv_start)


@settings(max_examples=80, deadline=None)
@given(kw=prefill_cases(), path=st.sampled_from(PATHS), tiles=st.sampled_from([0, 1, 2, 4]))
def test_matches_dense_and_reference(kw: dict, path: int, tiles: int) -> None:
    case = make_case(**kw)
    got = _run(case, path, tiles)
    assert got.dtype == case.q.dtype and got.shape == case.q.shape
    assert torch.isfinite(got).all()
    tol = TOLERANCE[case.q.dtype]
    err = (got.double() - dense_reference(case)).abs().max().item() if got.numel() else 0.0
    assert err <= tol, f"dense: max abs error {err} > {tol} for {kw}"
    if got.numel():
        err = (got.double() - _reference(case).double()).abs().max().item()
        assert err <= tol, f"reference: max abs error {err} > {tol} for {kw}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "window"),
                         [(9, 3, 64, None), (4, 1, 256, 40)])
def test_long_chunk_after_long_prefix(dtype: torch.dtype, heads: int, kv_heads: int,
                                      head_dim: int, window: int | None) -> None:
    """Many key tiles per item, masked and unmasked, the diagonal inside and across them:
    the model shapes (SmolLM2, Gemma 3's sliding layers) that the benchmark times."""
    case = make_case([700, 333], [300, 333], heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, block_tokens=16, dtype=dtype, window=window, seed=7)
    want = dense_reference(case)
    for path in PATHS:
        for tiles in (1, 3, 4):  # one row tile per item, or several sharing each key tile
            got = _run(case, path, tiles)
            assert (got.double() - want).abs().max() <= TOLERANCE[dtype], (path, tiles)


def test_bfloat16_paths_agree_and_the_fast_one_runs_here() -> None:
    """The two paths differ only in rounding (the fast one rounds P to bfloat16)."""
    case = make_case([200], [150], heads=8, kv_heads=2, head_dim=64, block_tokens=16,
                     dtype=torch.bfloat16, seed=2)
    fast, portable = _run(case), _run(case, prefill.PATH_PORTABLE)
    assert (fast.float() - portable.float()).abs().max() <= 2e-2
    if prefill.bf16_path():
        assert not torch.equal(fast, portable)  # a distinct path did run


def test_int64_indices_strided_tables_and_strided_queries() -> None:
    case = make_case([70, 300, 5], [20, 64, 5], heads=8, kv_heads=2, head_dim=64,
                     kv_starts=[3, 0, 0], window=100, dtype=torch.bfloat16, seed=1)
    want = _run(case)
    # A block table that is a column slice of a wider one (row stride != width), one whose
    # rows are not contiguous at all (transposed storage), with int64 ids.
    wide = torch.full((3, case.block_tables.shape[1] + 5), -1, dtype=torch.int64)
    wide[:, 2 : 2 + case.block_tables.shape[1]] = case.block_tables
    sliced = wide[:, 2 : 2 + case.block_tables.shape[1]]
    transposed = case.block_tables.t().contiguous().t()
    # Queries as the q part of a fused qkv projection: rows strided, heads contiguous.
    qkv = torch.randn(case.q.shape[0], 3, *case.q.shape[1:]).to(case.q.dtype)
    qkv[:, 0] = case.q
    for tables, q in ((sliced, case.q), (transposed, case.q), (case.block_tables, qkv[:, 0]),
                      (case.block_tables, case.q.transpose(1, 2).contiguous().transpose(1, 2))):
        assert not (tables.is_contiguous() and q.is_contiguous()) or tables is case.block_tables
        got = prefill.paged_prefill(q, case.k_pool, case.v_pool, case.cu_seqlens_q.long(),
                                    tables, case.seq_lens.long(), case.scale, case.window,
                                    case.kv_start.long())
        assert torch.equal(got, want)


def test_empty_batch_and_empty_chunks() -> None:
    case = make_case([10, 30], [0, 0], heads=4, kv_heads=2, head_dim=64, seed=4)
    assert _run(case).shape == (0, 4, 64)
    case = make_case([10, 30, 7], [0, 5, 0], heads=4, kv_heads=2, head_dim=64, seed=4)
    assert (_run(case).double() - dense_reference(case)).abs().max() <= TOLERANCE[torch.float32]


def test_supports_only_what_it_computes() -> None:
    case = make_case([20], [20], heads=4, kv_heads=2, head_dim=64, seed=0)
    assert prefill.supports(case.q, case.k_pool)
    assert not prefill.supports(case.q.half(), case.k_pool.half())
    assert not prefill.supports(case.q.bfloat16(), case.k_pool)  # mixed dtypes
    big = torch.zeros(1, 1, 1, prefill.MAX_HEAD_DIM + 1)
    assert not prefill.supports(big[:, 0], big)
