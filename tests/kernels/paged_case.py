"""Random paged-attention cases and the dense attention they must equal.

A case scatters each sequence's K/V over shuffled pool blocks (so a kernel that ignores the
block table reads the wrong keys) and keeps the contiguous copy for the dense reference,
which is computed in float64 with an explicit mask straight from the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor  # [tokens, H, D]
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    cu_seqlens_q: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    kv_start: torch.Tensor | None
    window: int | None
    scale: float
    k_seqs: list[torch.Tensor]  # contiguous [S, kvh, D] per sequence
    v_seqs: list[torch.Tensor]


def make_case(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    block_tokens: int = 16,
    dtype: torch.dtype = torch.float32,
    window: int | None = None,
    kv_starts: list[int] | None = None,
    spare_blocks: int = 3,
    seed: int = 0,
    device: str = "cpu",
) -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_tokens) for s in seq_lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need) + 1
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    k_pool = torch.randn(num_blocks, block_tokens, kv_heads, head_dim, generator=gen)
    v_pool = torch.randn(num_blocks, block_tokens, kv_heads, head_dim, generator=gen)
    k_pool, v_pool = k_pool.to(dtype), v_pool.to(dtype)
    k_seqs, v_seqs, used = [], [], 0
    for b, n in enumerate(need):
        ids = perm[used : used + n]
        used += n
        tables[b, :n] = ids.to(torch.int32)
        k_seqs.append(k_pool[ids].reshape(-1, kv_heads, head_dim)[: seq_lens[b]])
        v_seqs.append(v_pool[ids].reshape(-1, kv_heads, head_dim)[: seq_lens[b]])
    total_q = sum(q_lens)
    q = torch.randn(total_q, heads, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0, *list(torch.cumsum(torch.tensor(q_lens), 0))], dtype=torch.int32)
    ks = torch.tensor(kv_starts, dtype=torch.int32) if kv_starts is not None else None
    dev = torch.device(device)
    return PagedCase(
        q.to(dev),
        k_pool.to(dev),
        v_pool.to(dev),
        cu.to(dev),
        tables.to(dev),
        torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        ks.to(dev) if ks is not None else None,
        window,
        head_dim**-0.5,
        [k.to(dev) for k in k_seqs],
        [v.to(dev) for v in v_seqs],
    )


def dense_reference(case: PagedCase) -> torch.Tensor:
    """The contract, spelled out: float64 softmax over the visible keys of each query."""
    out = torch.zeros(case.q.shape, dtype=torch.float64)
    cu = case.cu_seqlens_q.tolist()
    starts = case.kv_start.tolist() if case.kv_start is not None else [0] * len(cu)
    heads = case.q.shape[1]
    for b, s in enumerate(case.seq_lens.tolist()):
        q = case.q[cu[b] : cu[b + 1]].double().cpu()
        lq = q.shape[0]
        if lq == 0:
            continue
        k = case.k_seqs[b].double().cpu()
        v = case.v_seqs[b].double().cpu()
        group = heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        pos = torch.arange(s - lq, s)[:, None]
        j = torch.arange(s)[None, :]
        vis = (j <= pos) & (j >= starts[b])
        if case.window is not None:
            vis &= pos - j < case.window
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        scores = scores.masked_fill(~vis[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[cu[b] : cu[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def decode_view(case: PagedCase) -> PagedCase:
    """The same sequences as a decode batch: the last token of each as its query."""
    last = (case.cu_seqlens_q[1:] - 1).long()
    q = case.q[last]
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return PagedCase(
        q,
        case.k_pool,
        case.v_pool,
        cu,
        case.block_tables,
        case.seq_lens,
        case.kv_start,
        case.window,
        case.scale,
        case.k_seqs,
        case.v_seqs,
    )


TOLERANCE = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
