"""The torch reference against the dense contract, on both of its compute paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.torch_ref import attention, decode
from tests.kernels.paged_case import TOLERANCE, dense_reference, make_case

PATHS = pytest.mark.parametrize("path", ["flash", "math"])


def _patched(path: str, chunk: int = 4096) -> pytest.MonkeyPatch:
    """Select the compute path (ATen flash or float32 matmul) and the KV chunk size."""
    mp = pytest.MonkeyPatch()
    if path == "math":
        mp.setenv("KERNELS_TORCH_MATH", "1")
    mp.setattr(attention, "KV_CHUNK_TOKENS", chunk)
    mp.setattr(decode, "DECODE_CHUNK_TOKENS", chunk)
    return mp


@st.composite
def cases(draw: st.DrawFn, decode: bool = False) -> dict:
    batch = draw(st.integers(1, 3))
    seq_lens = [draw(st.integers(1, 300)) for _ in range(batch)]
    q_lens = [1 if decode else draw(st.integers(1, s)) for s in seq_lens]
    heads, kv_heads = draw(st.sampled_from([(1, 1), (4, 2), (8, 2), (4, 4), (6, 1)]))
    window = draw(st.one_of(st.none(), st.integers(1, 200)))
    kv_starts = None
    if draw(st.booleans()):
        kv_starts = [draw(st.integers(0, s - q)) for s, q in zip(seq_lens, q_lens, strict=True)]
    return dict(
        seq_lens=seq_lens,
        q_lens=q_lens,
        heads=heads,
        kv_heads=kv_heads,
        block_tokens=draw(st.sampled_from([16, 32, 64])),
        window=window,
        kv_starts=kv_starts,
        seed=draw(st.integers(0, 2**16)),
    )


def _check(got: torch.Tensor, case_kw: dict, case) -> None:
    want = dense_reference(case)
    tol = TOLERANCE[case.q.dtype]
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    assert err <= tol, f"max abs error {err} > {tol} for {case_kw}"


@PATHS
@settings(max_examples=40, deadline=None)
@given(kw=cases(), chunk=st.sampled_from([16, 48, 4096]))
def test_prefill_matches_dense(path: str, kw: dict, chunk: int) -> None:
    case = make_case(**kw)
    mp = _patched(path, chunk)
    try:
        got = kernels.paged_prefill_attention(
            case.q,
            case.k_pool,
            case.v_pool,
            case.cu_seqlens_q,
            case.block_tables,
            case.seq_lens,
            case.scale,
            case.window,
            case.kv_start,
            backend="torch",
        )
    finally:
        mp.undo()
    _check(got, kw, case)


@PATHS
@settings(max_examples=40, deadline=None)
@given(kw=cases(decode=True), chunk=st.sampled_from([16, 48, 4096]))
def test_decode_matches_dense(path: str, kw: dict, chunk: int) -> None:
    case = make_case(**kw)
    mp = _patched(path, chunk)
    try:
        got = kernels.paged_decode_attention(
            case.q,
            case.k_pool,
            case.v_pool,
            case.block_tables,
            case.seq_lens,
            case.scale,
            case.window,
            case.kv_start,
            backend="torch",
        )
    finally:
        mp.undo()
    _check(got, kw, case)


@PATHS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(path: str, dtype: torch.dtype) -> None:
    kw = dict(
        seq_lens=[200, 77],
        q_lens=[64, 77],
        heads=8,
        kv_heads=2,
        block_tokens=32,
        window=50,
        dtype=dtype,
    )
    case = make_case(**kw)
    mp = _patched(path, 48)
    try:
        got = kernels.paged_prefill_attention(
            case.q,
            case.k_pool,
            case.v_pool,
            case.cu_seqlens_q,
            case.block_tables,
            case.seq_lens,
            case.scale,
            case.window,
            backend="torch",
        )
    finally:
        mp.undo()
    assert got.dtype == dtype
    _check(got, kw, case)


def test_empty_query_chunk_is_allowed() -> None:
    kw = dict(seq_lens=[40, 30], q_lens=[0, 5])
    case = make_case(**kw)
    got = kernels.paged_prefill_attention(
        case.q,
        case.k_pool,
        case.v_pool,
        case.cu_seqlens_q,
        case.block_tables,
        case.seq_lens,
        case.scale,
    )
    _check(got, kw, case)


def test_default_backend_on_cpu_is_the_compiled_kernel_when_built() -> None:
    from kernels.cpu_paged import decode as cpu_decode
    want = "torch" if cpu_decode._ext is None else "cpu_paged"
    assert kernels.default_backend_name("cpu") == want


def test_decode_inside_and_outside_inference_mode() -> None:
    """The decode workspace made under ``torch.inference_mode`` (as the engine runs) is not
    written outside it, nor the other way round."""
    kw = dict(seq_lens=[70, 30], q_lens=[1, 1], block_tokens=16)
    case = make_case(**kw)

    def decode_once() -> torch.Tensor:
        return kernels.paged_decode_attention(
            case.q, case.k_pool, case.v_pool, case.block_tables, case.seq_lens, case.scale,
            backend="torch")

    with torch.inference_mode():
        inside = decode_once()
    outside = decode_once()
    with torch.inference_mode():
        again = decode_once()
    assert torch.equal(inside, outside) and torch.equal(outside, again)
    _check(outside, kw, case)

