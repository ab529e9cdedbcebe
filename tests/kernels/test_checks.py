"""Bad arguments are refused before launch, with a message naming the argument."""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.kernels.paged_case import make_case


def _prefill(case, **over):
    args = dict(
        q=case.q,
        k_pool=case.k_pool,
        v_pool=case.v_pool,
        cu_seqlens_q=case.cu_seqlens_q,
        block_tables=case.block_tables,
        seq_lens=case.seq_lens,
        scale=case.scale,
        window=case.window,
        kv_start=case.kv_start,
    )
    args.update(over)
    return kernels.paged_prefill_attention(**args)


def test_out_of_range_block_id_is_refused() -> None:
    case = make_case([40, 20], [8, 4], block_tokens=16)
    tables = case.block_tables.clone()
    tables[1, 0] = case.k_pool.shape[0]
    with pytest.raises(kernels.BlockTableError, match=r"block_tables\[1, 0\]"):
        _prefill(case, block_tables=tables)
    tables[1, 0] = -1
    with pytest.raises(kernels.BlockTableError):
        _prefill(case, block_tables=tables)


def test_padding_beyond_used_blocks_is_ignored() -> None:
    case = make_case([40, 20], [8, 4], block_tokens=16)
    tables = case.block_tables.clone()
    tables[1, 2:] = 10**6  # sequence 1 uses 2 blocks only
    _prefill(case, block_tables=tables)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        (dict(scale=0.0), "scale"),
        (dict(window=0), "window"),
        (dict(seq_lens=torch.tensor([40, 3], dtype=torch.int32)), "seq_len 3"),
        (dict(seq_lens=torch.tensor([400, 20], dtype=torch.int32)), "columns"),
        (dict(cu_seqlens_q=torch.tensor([0, 8, 11], dtype=torch.int32)), "cu_seqlens_q"),
        (dict(kv_start=torch.tensor([33, 0], dtype=torch.int32)), "kv_start"),
        (dict(block_tables=torch.zeros(2, 4)), "block_tables"),
    ],
)
def test_bad_arguments(over: dict, match: str) -> None:
    case = make_case([40, 20], [8, 4], block_tokens=16)
    with pytest.raises(kernels.KernelArgumentError, match=match):
        _prefill(case, **over)


def test_query_must_match_pool() -> None:
    case = make_case([40], [8], heads=4, kv_heads=2, head_dim=16)
    with pytest.raises(kernels.KernelArgumentError, match="head_dim"):
        _prefill(case, q=torch.zeros(8, 4, 8))
    with pytest.raises(kernels.KernelArgumentError, match="multiple"):
        _prefill(case, q=torch.zeros(8, 3, 16))
    with pytest.raises(kernels.KernelArgumentError, match="dtype"):
        _prefill(case, q=case.q.half())
    with pytest.raises(kernels.KernelArgumentError, match="contiguous"):
        _prefill(case, k_pool=case.k_pool.transpose(2, 3).contiguous().transpose(2, 3))


def test_unknown_backend() -> None:
    case = make_case([40], [8])
    with pytest.raises(kernels.KernelArgumentError, match="unknown attention backend"):
        kernels.paged_prefill_attention(
            case.q,
            case.k_pool,
            case.v_pool,
            case.cu_seqlens_q,
            case.block_tables,
            case.seq_lens,
            case.scale,
            backend="nope",
        )
