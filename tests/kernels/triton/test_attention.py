"""The Triton kernels against the dense contract and the torch reference.

Under the interpreter (no GPU here) the cost of a case is the number of (query tile, key
tile) pairs the kernel visits, so the generated shapes are small (contexts ≤ 512) and the
key tile bounds the context: the cases cover every block size, tile size, GQA group
(including groups that are not powers of two), head_dim that is not a power of two,
windows, kv_start, ragged batches and empty chunks, and forced split-KV. On a device the
tiles are the planned ones (each variant costs a compile there).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.triton_backend.backend import TritonBackend
from kernels.triton_backend.plan import TritonConfig
from tests.kernels.paged_case import (
    TOLERANCE,
    PagedCase,
    decode_view,
    dense_reference,
    make_case,
)
from tests.kernels.triton.conftest import DEVICE

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [(1, 1), (4, 2), (8, 2), (4, 4), (6, 1), (8, 1)]
MAX_LEN = {16: 128, 32: 256, 64: 512}  # key tile → longest context drawn with it


@st.composite
def cases(draw: st.DrawFn, decode: bool) -> tuple[dict, TritonConfig]:
    tile = draw(st.sampled_from([16, 32, 64]))
    batch = draw(st.integers(1, 4 if decode else 3))
    seq_lens = [draw(st.integers(1, MAX_LEN[tile])) for _ in range(batch)]
    if decode:
        q_lens = [1] * batch
    else:
        q_lens = [draw(st.integers(0, min(s, 64))) for s in seq_lens]
        if not any(q_lens):
            q_lens[0] = 1
    heads, kv_heads = draw(st.sampled_from(HEADS))
    kv_starts = None
    if draw(st.booleans()):
        kv_starts = [draw(st.integers(0, s - q)) for s, q in zip(seq_lens, q_lens, strict=True)]
    split = None
    if decode or sum(q_lens) <= 8:  # the merge runs per (row, head): keep it small here
        split = draw(st.sampled_from([None, 64, 128]))
    kw = dict(
        seq_lens=seq_lens, q_lens=q_lens, heads=heads, kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([16, 24, 64])),
        block_tokens=draw(st.sampled_from([16, 32, 64])),
        dtype=draw(st.sampled_from(DTYPES)),
        window=draw(st.one_of(st.none(), st.integers(1, 600))),
        kv_starts=kv_starts, seed=draw(st.integers(0, 2**16)), device=DEVICE,
    )
    cfg = TritonConfig(key_tile_tokens=tile, prefill_rows=draw(st.sampled_from([16, 64])),
                       split_tokens=split)
    if DEVICE != "cpu":  # compiled: the tiles the device plans (each variant compiles)
        cfg = TritonConfig(split_tokens=split)
    return kw, cfg


def run(case: PagedCase, backend: kernels.AttentionBackend | str, decode: bool
        ) -> torch.Tensor:
    if decode:
        return kernels.paged_decode_attention(
            case.q, case.k_pool, case.v_pool, case.block_tables, case.seq_lens, case.scale,
            case.window, case.kv_start, backend=backend,
        )
    return kernels.paged_prefill_attention(
        case.q, case.k_pool, case.v_pool, case.cu_seqlens_q, case.block_tables,
        case.seq_lens, case.scale, case.window, case.kv_start, backend=backend,
    )


def check(case: PagedCase, backend: kernels.AttentionBackend, decode: bool,
          note: object = None) -> None:
    got = run(case, backend, decode)
    assert got.dtype == case.q.dtype and got.shape == case.q.shape
    tol = TOLERANCE[case.q.dtype]
    if got.numel() == 0:
        return
    dense_err = (got.double().cpu() - dense_reference(case)).abs().max().item()
    ref = run(case, "torch", decode)
    ref_err = (got.double() - ref.double()).abs().max().item()
    assert dense_err <= tol, f"vs dense: max abs error {dense_err} > {tol} for {note}"
    assert ref_err <= tol, f"vs torch: max abs error {ref_err} > {tol} for {note}"


@settings(max_examples=20, deadline=None)
@given(drawn=cases(decode=False))
def test_prefill_matches_dense_and_torch(drawn: tuple[dict, TritonConfig]) -> None:
    kw, cfg = drawn
    check(make_case(**kw), TritonBackend(cfg), decode=False, note=(kw, cfg))


@settings(max_examples=20, deadline=None)
@given(drawn=cases(decode=True))
def test_decode_matches_dense_and_torch(drawn: tuple[dict, TritonConfig]) -> None:
    kw, cfg = drawn
    check(make_case(**kw), TritonBackend(cfg), decode=True, note=(kw, cfg))


@pytest.mark.parametrize("block_tokens", [16, 32, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_block_size_and_dtype(backend: TritonBackend, block_tokens: int,
                                    dtype: torch.dtype) -> None:
    """The default tiles (as on a device) over a ragged batch with a cached prefix."""
    case = make_case([150, 40, 97], [20, 40, 1], heads=8, kv_heads=2, head_dim=64,
                     block_tokens=block_tokens, dtype=dtype, window=64, device=DEVICE)
    check(case, backend, decode=False)


def test_long_decode_is_split_and_merged() -> None:
    """Split-KV over a long context: 2 000 keys in 8 splits of 256, against one split."""
    case = make_case([2000, 1500], [1, 1], heads=8, kv_heads=2, head_dim=32,
                     block_tokens=64, seed=3, device=DEVICE)
    split = run(case, TritonBackend(TritonConfig(split_tokens=256)), decode=True)
    whole = run(case, TritonBackend(TritonConfig(split_tokens=4096)), decode=True)
    want = dense_reference(case)
    assert (split.double().cpu() - want).abs().max().item() <= TOLERANCE[torch.float32]
    assert (whole.double().cpu() - want).abs().max().item() <= TOLERANCE[torch.float32]


def test_short_chunk_over_long_prefix_is_split() -> None:
    case = make_case([1200], [3], heads=4, kv_heads=1, head_dim=16, block_tokens=32,
                     kv_starts=[100], window=900, device=DEVICE)
    check(case, TritonBackend(TritonConfig(split_tokens=128)), decode=False)


@pytest.mark.parametrize("window", [1, 2, 10_000])
def test_window_edges(backend: TritonBackend, window: int) -> None:
    """Window 1 sees only itself; a window longer than the sequence hides nothing."""
    case = make_case([70, 33], [70, 5], heads=4, kv_heads=2, window=window, device=DEVICE)
    check(case, backend, decode=False)
    check(decode_view(case), backend, decode=True)


@pytest.mark.parametrize("head_dim", [8, 24, 96])
def test_head_dim_not_a_tile(backend: TritonBackend, head_dim: int) -> None:
    case = make_case([90], [30], heads=4, kv_heads=1, head_dim=head_dim, device=DEVICE)
    check(case, backend, decode=False)


def test_unread_memory_never_reaches_the_output(backend: TritonBackend) -> None:
    """NaN in every pool slot a query may not see (block 0, which masked-off lanes of the
    kernel address, unused blocks, slots past a sequence's end, positions before
    kv_start) and absurd ids in unused block-table columns: the kernel must not load
    them (a masked-off load of NaN would turn 0 × NaN into NaN)."""
    case = make_case([45, 20], [9, 20], heads=4, kv_heads=2, block_tokens=16,
                     kv_starts=[13, 0], spare_blocks=4, device=DEVICE)
    clean = run(case, backend, decode=False)
    bt = case.k_pool.shape[1]
    nan_block = torch.full_like(case.k_pool[:1], float("nan"))
    k_pool = torch.cat([nan_block, torch.full_like(case.k_pool, float("nan"))])
    v_pool = torch.cat([nan_block, torch.full_like(case.v_pool, float("nan"))])
    tables = torch.full_like(case.block_tables, 10**6)
    for b, (s, ks) in enumerate(zip(case.seq_lens.tolist(), case.kv_start.tolist(),
                                    strict=True)):
        for pos in range(ks, s):
            block = int(case.block_tables[b, pos // bt]) + 1
            k_pool[block, pos % bt] = case.k_seqs[b][pos]
            v_pool[block, pos % bt] = case.v_seqs[b][pos]
        tables[b, : -(-s // bt)] = case.block_tables[b, : -(-s // bt)] + 1
    got = kernels.paged_prefill_attention(
        case.q, k_pool, v_pool, case.cu_seqlens_q, tables, case.seq_lens, case.scale,
        None, case.kv_start, backend=backend,
    )
    assert torch.isfinite(got).all()
    assert torch.equal(got, clean)


def test_by_registered_name() -> None:
    """``backend="triton"`` goes through the registry to the same kernels."""
    case = make_case([33], [33], device=DEVICE)
    check(case, kernels.get_backend("triton"), decode=False)
    got = run(case, "triton", decode=False)
    assert torch.equal(got, run(case, kernels.get_backend("triton"), decode=False))


def test_out_of_range_block_id_is_refused(backend: TritonBackend) -> None:
    case = make_case([40, 20], [8, 4], block_tokens=16, device=DEVICE)
    tables = case.block_tables.clone()
    tables[1, 1] = case.k_pool.shape[0]
    with pytest.raises(kernels.BlockTableError, match=r"block_tables\[1, 1\]"):
        kernels.paged_decode_attention(case.q[:2].contiguous(), case.k_pool, case.v_pool, tables,
                                       case.seq_lens, case.scale, backend=backend)
    with pytest.raises(kernels.KernelArgumentError, match="head_dim"):
        kernels.paged_prefill_attention(
            case.q[:, :, :8], case.k_pool, case.v_pool, case.cu_seqlens_q,
            case.block_tables, case.seq_lens, case.scale, backend=backend)
