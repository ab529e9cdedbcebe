"""The batch-invariant backend: right (against the dense contract) and invariant (a query
row's output bitwise the same however its rows are chunked, whatever else shares the call,
as a decode or as a prefill row), and the padded products it stands on."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.invariant.matmul import ROW_TILE, invariant_bmm, invariant_linear
from tests.kernels.paged_case import PagedCase, decode_view, make_case
from tests.kernels.test_torch_ref import _check, cases


@settings(max_examples=40, deadline=None)
@given(kw=cases())
def test_prefill_matches_dense(kw: dict) -> None:
    case = make_case(**kw)
    got = kernels.paged_prefill_attention(
        case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
        case.seq_lens, case.scale, case.window, case.kv_start, backend="invariant")
    _check(got, kw, case)


@settings(max_examples=40, deadline=None)
@given(kw=cases(decode=True))
def test_decode_matches_dense(kw: dict) -> None:
    case = make_case(**kw)
    got = kernels.paged_decode_attention(
        case.q, case.k_pool, case.v_pool, case.block_tables, case.seq_lens, case.scale,
        case.window, case.kv_start, backend="invariant")
    _check(got, kw, case)


def _first(case: PagedCase, b: int) -> int:
    return 0 if case.kv_start is None else int(case.kv_start[b])


def _prefill(case: PagedCase, b: int, p0: int, p1: int, backend: str) -> torch.Tensor:
    """The rows at positions ``p0 … p1 − 1`` of sequence ``b`` (whose case holds a query
    for every position from its ``kv_start``) as one chunk of a sequence then ``p1``
    tokens long."""
    row0 = int(case.cu_seqlens_q[b]) - _first(case, b)
    q = case.q[row0 + p0 : row0 + p1]
    q0, q1 = p0, p1
    return kernels.paged_prefill_attention(
        q, case.k_pool, case.v_pool, torch.tensor([0, q1 - q0], dtype=torch.int32),
        case.block_tables[b : b + 1], torch.tensor([q1], dtype=torch.int32), case.scale,
        case.window, None if case.kv_start is None else case.kv_start[b : b + 1],
        backend=backend)


def _chunked(case: PagedCase, b: int, length: int, chunk: int, backend: str) -> torch.Tensor:
    first = _first(case, b)
    return torch.cat([_prefill(case, b, c0, min(length, c0 + chunk), backend)
                      for c0 in range(first, length, chunk)])


@st.composite
def whole_prompts(draw: st.DrawFn) -> tuple[dict, int]:
    batch = draw(st.integers(2, 4))
    seq_lens = [draw(st.integers(1, 260)) for _ in range(batch)]
    heads, kv_heads = draw(st.sampled_from([(4, 2), (6, 1), (3, 3)]))
    kw = dict(seq_lens=seq_lens, q_lens=list(seq_lens), heads=heads, kv_heads=kv_heads,
              block_tokens=draw(st.sampled_from([16, 64])),
              window=draw(st.one_of(st.none(), st.integers(1, 150))),
              dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
              seed=draw(st.integers(0, 2**16)))
    if draw(st.booleans()):  # bounded replay: no key (and no query) before kv_start
        kw["kv_starts"] = [draw(st.integers(0, s - 1)) for s in seq_lens]
        kw["q_lens"] = [s - k for s, k in zip(seq_lens, kw["kv_starts"], strict=True)]
    return kw, draw(st.integers(1, 130))


@settings(max_examples=30, deadline=None)
@given(case_chunk=whole_prompts())
def test_a_row_is_the_same_however_it_is_batched(case_chunk: tuple[dict, int]) -> None:
    """Whole prompts in one call = each alone = each chunked; the last row as a decode
    alone = in a decode batch of ragged lengths (masked blocks are no-ops) = as prefill."""
    kw, chunk = case_chunk
    case = make_case(**kw)
    together = kernels.paged_prefill_attention(
        case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
        case.seq_lens, case.scale, case.window, case.kv_start, backend="invariant")
    cu = case.cu_seqlens_q.tolist()
    dec = decode_view(case)
    batch_decode = kernels.paged_decode_attention(
        dec.q, dec.k_pool, dec.v_pool, dec.block_tables, dec.seq_lens, dec.scale,
        dec.window, dec.kv_start, backend="invariant")
    for b, length in enumerate(kw["seq_lens"]):
        alone = _prefill(case, b, _first(case, b), length, "invariant")
        assert torch.equal(together[cu[b] : cu[b + 1]], alone)
        assert torch.equal(_chunked(case, b, length, chunk, "invariant"), alone)
        one = kernels.paged_decode_attention(
            dec.q[b : b + 1], dec.k_pool, dec.v_pool, dec.block_tables[b : b + 1],
            dec.seq_lens[b : b + 1], dec.scale, dec.window,
            None if dec.kv_start is None else dec.kv_start[b : b + 1], backend="invariant")
        assert torch.equal(one, alone[-1:])
        assert torch.equal(batch_decode[b : b + 1], alone[-1:])


def test_the_reference_backend_is_not_invariant() -> None:
    """What the test above guards against: the reference's chunked rows differ in bits."""
    case = make_case([300], [300], heads=4, kv_heads=2, head_dim=64, seed=3)
    whole = _prefill(case, 0, 0, 300, "torch")
    assert not torch.equal(_chunked(case, 0, 300, 128, "torch"), whole)
    whole = _prefill(case, 0, 0, 300, "invariant")
    assert torch.equal(_chunked(case, 0, 300, 128, "invariant"), whole)


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(1, 300), min_size=1, max_size=4),
       shape=st.sampled_from([(64, 96), (576, 960), (1536, 576)]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_padded_linear_rows_do_not_depend_on_the_batch(rows: list[int], shape: tuple[int, int],
                                                       dtype: torch.dtype, seed: int) -> None:
    k, n = shape
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    x = torch.randn(max(rows), k, generator=gen).to(dtype)
    alone = torch.cat([invariant_linear(x[i : i + 1], w, bias) for i in range(max(rows))])
    for m in rows:
        assert torch.equal(invariant_linear(x[:m], w, bias), alone[:m])
    assert invariant_linear(x[:1, None], w).shape == (1, 1, n)


def test_invariant_bmm_wants_padded_rows() -> None:
    a = torch.zeros(2, ROW_TILE + 1, 4)
    with pytest.raises(ValueError, match="padded"):
        invariant_bmm(a, torch.zeros(2, 4, 3))
