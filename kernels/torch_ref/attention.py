"""Paged prefill and decode attention in plain torch: the numbers every backend must match.

One Python iteration per sequence and per KV chunk of at most ``kv_chunk_tokens`` tokens
(a bounded gather through the block table); never one per block, never the whole sequence
gathered at once.

For a sequence of ``S`` tokens whose chunk holds ``Lq`` queries at positions
``start = S − Lq … S − 1``, the keys split into::

    kv_start / window edge        start              S
    |---- prefix chunks ----------|---- diagonal ----|
      every query sees all of it     query i sees keys start … start + i
      (masked only where a window
       cuts rows off)

The prefix needs a mask only when a sliding window hides some of it from later rows.
"""

from __future__ import annotations

import torch

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
    """``q`` is ``[Lq, H, D]`` at the last ``Lq`` positions; returns ``[Lq, H, D]``."""
    kv_chunk_tokens = kv_chunk_tokens or KV_CHUNK_TOKENS
    lq = q.shape[0]
    start = seq_len - lq
    qh = q.permute(1, 0, 2).contiguous()  # [H, Lq, D]
    lo = kv_start if window is None else max(kv_start, start - window + 1)
    rows = torch.arange(start, seq_len, device=q.device)
    acc: tuple[torch.Tensor, torch.Tensor] | None = None

    def visible(c0: int, c1: int) -> torch.Tensor:
        cols = torch.arange(c0, c1, device=q.device)
        vis = (cols[None, :] <= rows[:, None]) & (cols[None, :] >= kv_start)
        if window is not None:
            vis &= rows[:, None] - cols[None, :] < window
        return vis

    # Keys up to and including ``start`` are visible to every row (unless a window hides
    # them from later rows), so decode (Lq = 1) is a single unmasked pass.
    c0 = lo
    while c0 <= start:
        c1 = min(start + 1, c0 + kv_chunk_tokens)
        # The last row (position S−1) is the first to lose old keys to the window.
        full = window is None or (seq_len - 1) - c0 < window
        k = _gather(k_pool, table_row, c0, c1)
        v = _gather(v_pool, table_row, c0, c1)
        acc = merge(acc, attend(qh, k, v, scale, None if full else visible(c0, c1)))
        c0 = c1
    # Keys after ``start``: row r sees keys start+1 … start+r, i.e. rows 1… against them
    # are top-left causal when one chunk holds them all and no window cuts in.
    for d0 in range(start + 1, seq_len, kv_chunk_tokens):
        d1 = min(seq_len, d0 + kv_chunk_tokens)
        first_row = d0 - start  # earlier rows see none of these keys
        k = _gather(k_pool, table_row, d0, d1)
        v = _gather(v_pool, table_row, d0, d1)
        qpart = qh[:, first_row:]
        plain = d0 == start + 1 and d1 == seq_len and (window is None or window >= lq - 1)
        if plain:
            part = attend(qpart, k, v, scale, None, causal=True)
        else:
            part = attend(qpart, k, v, scale, visible(d0, d1)[first_row:])
        o = torch.zeros(qh.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(qh.shape[:2], float("-inf"), device=q.device)
        o[:, first_row:], lse[:, first_row:] = part
        acc = merge(acc, (o, lse))
    if acc is None:  # unreachable: lo <= start, so the first loop ran
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
    out = torch.empty_like(q)
    lens = seq_lens.tolist()
    starts = kv_start.tolist() if kv_start is not None else [0] * len(lens)
    for b, s in enumerate(lens):
        out[b : b + 1] = attend_sequence(
            q[b : b + 1], k_pool, v_pool, block_tables[b], s, scale, window, starts[b]
        )
    return out
