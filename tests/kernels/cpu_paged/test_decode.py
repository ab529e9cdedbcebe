"""The C paged-decode kernel against the dense contract and the torch reference.

Random shuffled pools (a kernel that ignores the block table reads the wrong keys), ragged
and one-token sequences, block sizes, GQA ratios, both dtypes, windows and ``kv_start``,
forced key splits (the merge), strided queries and block tables, int32 and int64 indices,
and both item paths: the AVX-512 BF16 one (bfloat16, head_dim a multiple of 32, where the
CPU has it; keys 16 at a time, so lengths off multiples of 16 and of the block matter) and
the portable one (``path=PATH_PORTABLE``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.cpu_paged import decode
from kernels.torch_ref.decode import paged_decode as reference_decode
from tests.kernels.paged_case import TOLERANCE, decode_view, dense_reference, make_case

pytestmark = pytest.mark.skipif(decode._ext is None, reason="kernels._paged_decode not built")


@st.composite
def decode_cases(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 4))
    seq_lens = [draw(st.one_of(st.just(1), st.integers(1, 700))) for _ in range(batch)]
    heads, kv_heads = draw(st.sampled_from([(1, 1), (4, 2), (9, 3), (8, 2), (6, 1), (16, 1),
                                            (12, 1), (12, 4)]))
    kv_starts = None
    if draw(st.booleans()):
        kv_starts = [draw(st.integers(0, s - 1)) for s in seq_lens]
    return dict(
        seq_lens=seq_lens,
        q_lens=[1] * batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([16, 32, 64, 80, 128, 256])),
        block_tokens=draw(st.sampled_from([1, 16, 48, 64])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        window=draw(st.one_of(st.none(), st.integers(1, 300))),
        kv_starts=kv_starts,
        seed=draw(st.integers(0, 2**16)),
    )


PATHS = [decode.PATH_BEST, decode.PATH_PORTABLE]


def _run(case, splits: int = 0, path: int = decode.PATH_BEST) -> torch.Tensor:
    return decode.paged_decode(case.q, case.k_pool, case.v_pool, case.block_tables,
                               case.seq_lens, case.scale, case.window, case.kv_start,
                               splits=splits, path=path)


def _indices(case, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    """The case with its block table, lengths and ``kv_start`` in ``dtype``."""
    case.block_tables = case.block_tables.to(dtype)
    case.seq_lens = case.seq_lens.to(dtype)
    if case.kv_start is not None:
        case.kv_start = case.kv_start.to(dtype)
    return case


@settings(max_examples=80, deadline=None)
@given(kw=decode_cases(), splits=st.sampled_from([0, 1, 2, 5]), path=st.sampled_from(PATHS),
       index=st.sampled_from([torch.int32, torch.int64]))
def test_matches_dense_and_reference(kw: dict, splits: int, path: int,
                                     index: torch.dtype) -> None:
    case = _indices(decode_view(make_case(**kw)), index)
    got = _run(case, splits, path)
    assert got.dtype == case.q.dtype and got.shape == case.q.shape
    tol = TOLERANCE[case.q.dtype]
    err = (got.double() - dense_reference(case)).abs().max().item()
    assert err <= tol, f"dense: max abs error {err} > {tol} for {kw}"
    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.block_tables,
                           case.seq_lens, case.scale, case.window, case.kv_start)
    err = (got.double() - ref.double()).abs().max().item()
    assert err <= tol, f"reference: max abs error {err} > {tol} for {kw}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_splits_change_nothing_beyond_rounding(dtype: torch.dtype) -> None:
    case = decode_view(make_case([900, 1, 513], [1, 1, 1], heads=9, kv_heads=3,
                                 head_dim=64, dtype=dtype, seed=3))
    one = _run(case, 1)
    for splits in (2, 3, 7, 64):
        assert (one.double() - _run(case, splits).double()).abs().max() <= TOLERANCE[dtype]


def test_int64_indices_and_strided_tables_and_queries() -> None:
    case = decode_view(make_case([70, 300, 5], [1, 1, 1], heads=8, kv_heads=2,
                                 head_dim=64, kv_starts=[3, 0, 4], window=100, seed=1))
    want = _run(case)
    # A block table that is a column slice of a wider one (row stride != width) and one
    # whose rows are not contiguous at all (transposed storage), with int64 ids and lengths.
    wide = torch.full((3, case.block_tables.shape[1] * 2), -1, dtype=torch.int64)
    wide[:, ::2] = case.block_tables
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    transposed = case.block_tables.long().t().contiguous().t()
    q_wide = torch.zeros(3, 8, 2 * 64)
    q_wide[:, :, :64] = case.q
    q = q_wide[:, :, :64]
    assert case.kv_start is not None
    for tables in (strided, transposed):
        got = decode.paged_decode(q, case.k_pool, case.v_pool, tables, case.seq_lens.long(),
                                  case.scale, case.window, case.kv_start.long(), splits=0)
        assert torch.equal(got, want)


@pytest.mark.parametrize("path", PATHS)
def test_bf16_int64_indices_and_strided_tables_and_queries(path: int) -> None:
    case = decode_view(make_case([70, 300, 5], [1, 1, 1], heads=8, kv_heads=2, head_dim=64,
                                 kv_starts=[3, 0, 4], window=100, dtype=torch.bfloat16, seed=1))
    want = _run(case, 0, path)
    wide = torch.full((3, case.block_tables.shape[1] * 2), -1, dtype=torch.int64)
    wide[:, ::2] = case.block_tables
    q_wide = torch.zeros(3, 8, 2 * 64, dtype=torch.bfloat16)
    q_wide[:, :, :64] = case.q
    assert case.kv_start is not None
    got = decode.paged_decode(q_wide[:, :, :64], case.k_pool, case.v_pool, wide[:, ::2],
                              case.seq_lens.long(), case.scale, case.window,
                              case.kv_start.long(), path=path)
    assert torch.equal(got, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [0, 3])
def test_a_row_that_sees_no_key_is_zero(dtype: torch.dtype, path: int, splits: int) -> None:
    """The contract's empty row (the checks keep the engine from ever passing one), beside
    sequences that see keys."""
    case = decode_view(make_case([40, 700, 33], [1, 1, 1], heads=4, kv_heads=2, head_dim=64,
                                 dtype=dtype, seed=2))
    start = torch.tensor([40, 0, 33], dtype=torch.int32)
    got = decode.paged_decode(case.q, case.k_pool, case.v_pool, case.block_tables,
                              case.seq_lens, case.scale, None, start, splits=splits, path=path)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    case.kv_start = start
    err = (got[1].double() - dense_reference(case)[1]).abs().max().item()
    assert err <= TOLERANCE[dtype]


@pytest.mark.skipif(not decode.bf16_path(), reason="this CPU has no AVX-512 BF16")
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_bf16_calls_take_the_fast_path_here(head_dim: int) -> None:
    """What the extension reports it ran: the AVX-512 BF16 path for bfloat16 with head_dim a
    multiple of 32 unless the portable one is asked for; never for float32."""
    for dtype, path, want in ((torch.bfloat16, decode.PATH_BEST, True),
                              (torch.bfloat16, decode.PATH_PORTABLE, False),
                              (torch.float32, decode.PATH_BEST, False)):
        case = decode_view(make_case([50], [1], heads=6, kv_heads=2, head_dim=head_dim,
                                     dtype=dtype))
        out = torch.empty_like(case.q)
        ran = decode._ext.paged_decode(
            out.data_ptr(), case.q.data_ptr(), case.k_pool.data_ptr(), case.v_pool.data_ptr(),
            case.block_tables.data_ptr(), case.seq_lens.data_ptr(), 0, case.q.stride(0),
            case.q.stride(1), case.block_tables.stride(0), 1, 6, 2, head_dim, 16, 0,
            int(dtype == torch.bfloat16), 0, case.scale, 0, 0, path)
        assert ran is want
        assert torch.equal(out, _run(case, 0, path))


@pytest.mark.parametrize("head_dim,heads,kv_heads,window", [
    (64, 9, 3, None),    # SmolLM2-135M
    (256, 4, 1, 512),    # Gemma 3 270M: sliding layers
    (128, 16, 8, None),  # Qwen3-style
    (64, 16, 1, 100),    # the largest group
])
def test_bf16_paths_agree_on_model_shapes(head_dim: int, heads: int, kv_heads: int,
                                          window: int | None) -> None:
    """Both paths against the dense contract on the shapes the engine's models run, with
    lengths off multiples of 16 and of the block, a window and ``kv_start`` cutting into the
    first block (so a chunk starts mid-block), and forced splits."""
    case = decode_view(make_case([1, 17, 600, 1030], [1] * 4, heads=heads, kv_heads=kv_heads,
                                 head_dim=head_dim, block_tokens=64, dtype=torch.bfloat16,
                                 window=window, kv_starts=[0, 5, 37, 3], seed=7))
    want = dense_reference(case)
    for path in PATHS:
        for splits in (0, 1, 4):
            err = (_run(case, splits, path).double() - want).abs().max().item()
            assert err <= TOLERANCE[torch.bfloat16], (path, splits, err)


def test_empty_batch() -> None:
    case = decode_view(make_case([16], [1]))
    got = decode.paged_decode(case.q[:0], case.k_pool, case.v_pool, case.block_tables[:0],
                              case.seq_lens[:0], case.scale, None, None)
    assert got.shape == (0, *case.q.shape[1:])


def test_supports_leaves_float16_and_huge_groups_to_the_reference() -> None:
    q = torch.zeros(1, 4, 16, dtype=torch.float16)
    pool = torch.zeros(2, 16, 2, 16, dtype=torch.float16)
    assert not decode.supports(q, pool)
    assert decode.supports(q.float(), pool.float())
    assert not decode.supports(torch.zeros(1, decode.MAX_GROUP + 1, 16), pool.float()[:, :, :1])
    assert not decode.supports(torch.zeros(1, 2, decode.MAX_HEAD_DIM + 8),
                               torch.zeros(1, 1, 2, decode.MAX_HEAD_DIM + 8))


def test_float16_goes_through_the_backend_to_the_reference() -> None:
    case = decode_view(make_case([50, 3], [1, 1], dtype=torch.float16, seed=4))
    got = kernels.paged_decode_attention(case.q, case.k_pool, case.v_pool, case.block_tables,
                                         case.seq_lens, case.scale, backend="cpu_paged")
    err = (got.double() - dense_reference(case)).abs().max().item()
    assert err <= TOLERANCE[torch.float16]


def test_inside_inference_mode_and_out() -> None:
    case = decode_view(make_case([70, 30], [1, 1], dtype=torch.bfloat16))
    with torch.inference_mode():
        inside = _run(case)
    assert torch.equal(inside, _run(case))
