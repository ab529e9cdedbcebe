"""Paged prefill and decode attention in plain torch: the numbers every backend must match.

One Python iteration per sequence, per query tile and per KV chunk of at most
``kv_chunk_tokens`` tokens (a bounded gather through the block table); never one per
block, never the whole sequence gathered at once.

A query tile holds rows at positions ``first … end − 1``; its keys split into::

    kv_start / window edge        first              end
    |---- prefix chunks ----------|---- diagonal ----|
      every row sees all of it       row i sees keys first … first + i
      (masked only where a window    (a square: top-left causal)
       cuts rows off)

The prefix needs a mask only when a sliding window hides some of it from later rows.
"""

from __future__ import annotations

import torch

from kernels.torch_ref import decode
from kernels.torch_ref.chunk import attend, merge

#: Upper bound on the KV tokens gathered per step; multiple of every supported block size.
KV_CHUNK_TOKENS = 4096


def _gather(
    pool: torch.Tensor, table_row: torch.Tensor, lo: int, hi: int
) -> torch.Tensor:
    """Tokens ``[lo, hi)`` of one sequence as ``[hi − lo, kv_heads, D]``."""
    bt = pool.shape[1]
    b0, b1 = lo // bt, -(-hi // bt)
    blocks = pool.index_select(0, table_row[b0:b1])
    flat = blocks.view(-1, pool.shape[2], pool.shape[3])
    return flat[lo - b0 * bt : hi - b0 * bt]


def attend_sequence(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table_row: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int | None,
    kv_start: int,
    kv_chunk_tokens: int | None = None,
) -> torch.Tensor:
    """``q`` is ``[Lq, H, D]`` at the last ``Lq`` positions; returns ``[Lq, H, D]``.

    Queries go in tiles of at most ``kv_chunk_tokens`` rows, so the causal part of each
    tile is one square block that ATen's kernel masks itself (``is_causal``), and no mask
    tensor is built unless a window cuts into a chunk."""
    chunk = kv_chunk_tokens or KV_CHUNK_TOKENS
    lq = q.shape[0]
    start = seq_len - lq
    out = torch.empty_like(q)
    for t0 in range(0, lq, chunk):
        t1 = min(lq, t0 + chunk)
        out[t0:t1] = _attend_rows(q[t0:t1], k_pool, v_pool, table_row, start + t0,
                                  scale, window, kv_start, chunk)
    return out


def _attend_rows(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table_row: torch.Tensor,
    first: int,
    scale: float,
    window: int | None,
    kv_start: int,
    chunk: int,
) -> torch.Tensor:
    """Query rows at positions ``first … first + Lt − 1`` (``Lt ≤ chunk``)."""
    lt = q.shape[0]
    end = first + lt
    qh = q.permute(1, 0, 2).contiguous()  # [H, Lt, D]
    rows = torch.arange(first, end, device=q.device)

    def visible(c0: int, c1: int) -> torch.Tensor:
        cols = torch.arange(c0, c1, device=q.device)
        vis = (cols[None, :] <= rows[:, None]) & (cols[None, :] >= kv_start)
        if window is not None:
            vis &= rows[:, None] - cols[None, :] < window
        return vis

    def kv(c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _gather(k_pool, table_row, c0, c1), _gather(v_pool, table_row, c0, c1)

    # Keys before ``first`` are visible to every row (unless a window hides old ones from
    # later rows); keys ``first … end − 1`` form a square that is top-left causal for the
    # tile. One row (decode) needs no square: its own key joins the prefix.
    lo = kv_start if window is None else max(kv_start, first - window + 1)
    diag = first if lt > 1 else end
    acc: tuple[torch.Tensor, torch.Tensor] | None = None
    for c0 in range(lo, diag, chunk):
        c1 = min(diag, c0 + chunk)
        # The last row is the first to lose old keys to the window.
        full = window is None or (end - 1) - c0 < window
        acc = merge(acc, attend(qh, *kv(c0, c1), scale, None if full else visible(c0, c1)))
    if diag < end:
        if window is None or window >= lt:  # the window cuts nothing inside the square
            part = attend(qh, *kv(diag, end), scale, None, causal=True)
        else:
            part = attend(qh, *kv(diag, end), scale, visible(diag, end))
        acc = merge(acc, part)
    if acc is None:  # unreachable: lo <= first < end
        raise RuntimeError("no key chunk attended")
    return acc[0].permute(1, 0, 2).to(q.dtype)


def paged_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    kv_start: torch.Tensor | None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    starts = kv_start.tolist() if kv_start is not None else [0] * len(lens)
    for b, s in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        out[q0:q1] = attend_sequence(
            q[q0:q1], k_pool, v_pool, block_tables[b], s, scale, window, starts[b]
        )
    return out


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    kv_start: torch.Tensor | None,
) -> torch.Tensor:
    """Batched over the step's sequences: see ``decode.py``."""
    return decode.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, scale, window,
                               kv_start)
