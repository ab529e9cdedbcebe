"""Paged attention whose result for a query row depends only on that row and its keys.

The reference backend (``kernels.torch_ref``) splits a chunk's keys into "before the
chunk" and "the chunk's own square" and lets ATen's flash kernel pick its own tiling by
the query and key counts, so the same token attends in a different order when its prompt
is prefilled whole, in 128-token chunks, or after a cached prefix. Here the order is fixed
by the token's position alone:

- keys are walked in blocks of ``KEY_BLOCK_TOKENS`` aligned to absolute position 0 (not
  to the chunk, not to the pool's blocks), one block after the other, combined with an
  online softmax (running max, running sum, rescaled accumulator) in float32;
- a block a row cannot see (a later key, before ``kv_start`` or out of its window) is
  masked to ``-inf``; its update is then exactly a no-op (the max does not move, so the
  rescale factor is ``exp(0) = 1``, and the block adds ``+0``), so how many masked blocks a
  row walks through (because a later row of its chunk needs them, or another sequence of
  the batch is longer) cannot change it;
- the query rows of each segment are padded to a multiple of ``ROW_TILE`` so every
  product has the row shape ``kernels.invariant.matmul`` measured invariant, and a block's
  keys are always ``KEY_BLOCK_TOKENS`` wide (short ends padded, masked), so the reductions
  over keys (the max, the sum, ``p @ v``) always have one length;
- decode rows are the same computation with one query per sequence, batched over the
  step's sequences, so a token's logits do not depend on whether it ran as a decode or as
  the last row of a prefill (a recompute after preemption).

Slower than the reference (a Python iteration per 128 keys, no flash kernel): the price of
``--deterministic``, measured in bench/RESULTS.md.
"""

from __future__ import annotations

import torch

from kernels.invariant.matmul import ROW_TILE, invariant_bmm

#: Keys per online-softmax step; fixed, so a row's reduction order never depends on the
#: pool's block size or on the chunking.
KEY_BLOCK_TOKENS = 128
#: The running max's start: below any real score, finite so a masked block cannot make NaN.
_FLOOR = -1e30


def attend_segments(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    q_lens: list[int],
    scale: float,
    window: int | None,
    kv_starts: list[int],
) -> list[torch.Tensor]:
    """Segment ``s`` is the last ``q_lens[s]`` tokens of a sequence of ``seq_lens[s]``
    tokens (its KV in the pool through ``block_tables[s]``); ``q`` holds the segments'
    rows back to back ``[sum(q_lens), H, D]``. Returns each segment's ``[q_len, H, D]``."""
    _, bt, kvh, d = k_pool.shape
    heads = q.shape[1]
    group = heads // kvh
    nseg = len(seq_lens)
    lq = max(q_lens)
    dev = q.device
    # Row (g, i) of segment s, KV head h is query row cu[s] + i, head h × group + g. Rows
    # past a segment's length repeat its last one (its query and position: they see keys,
    # stay finite, and are dropped); the rows are then zero-padded to the row tile (those
    # see their segment's last position too).
    n = torch.tensor(q_lens, dtype=torch.int64, device=dev)[:, None]
    cu = torch.cumsum(n, 0) - n
    r = torch.minimum(torch.arange(lq, device=dev)[None, :], n - 1)  # [S, Lq]
    qs = q.index_select(0, (cu + r).flatten()).view(nseg, lq, kvh, group, d)
    real = group * lq
    rows = max(ROW_TILE, -(-real // ROW_TILE) * ROW_TILE)
    qf = torch.zeros(nseg, kvh, rows, d, dtype=torch.float32, device=dev)
    qf[:, :, :real] = qs.permute(0, 2, 3, 1, 4).reshape(nseg, kvh, real, d)
    qf = qf.mul_(scale).view(nseg * kvh, rows, d)
    pos = torch.tensor(seq_lens, dtype=torch.int64, device=dev)[:, None] - n + r  # [S, Lq]
    pos_rows = torch.cat([pos.repeat(1, group), pos[:, -1:].expand(nseg, rows - real)], 1)
    lo = torch.tensor(kv_starts, dtype=torch.int64, device=dev)[:, None]  # [S, 1]
    low = lo.expand(nseg, rows) if window is None else torch.maximum(
        lo, pos_rows - window + 1)
    kb = KEY_BLOCK_TOKENS
    first = int(low.min()) // kb
    nblk = (max(seq_lens) - 1) // kb + 1 - first
    # Every key the walk reads, gathered once, laid out one contiguous block after the
    # other: [blocks, S × kv_heads, D, KB] (K) and [blocks, S × kv_heads, KB, D] (V).
    # Positions past a sequence's end read its first slot (any valid one) and are masked.
    keys = torch.arange(first * kb, (first + nblk) * kb, device=dev)
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=dev)[:, None]
    safe = torch.where(keys[None, :] < lens, keys[None, :], 0)
    slots = (block_tables.to(torch.int64).gather(1, safe // bt) * bt + safe % bt).flatten()
    k_all = k_pool.view(-1, kvh, d).index_select(0, slots).view(nseg, nblk, kb, kvh, d)
    v_all = v_pool.view(-1, kvh, d).index_select(0, slots).view(nseg, nblk, kb, kvh, d)
    kf_all = k_all.permute(1, 0, 3, 4, 2).float().reshape(nblk, nseg * kvh, d, kb)
    vf_all = v_all.permute(1, 0, 3, 2, 4).float().reshape(nblk, nseg * kvh, kb, d)
    # The running max starts at a finite floor rather than -inf: a fully masked block then
    # leaves it unchanged (rescale exp(0) = 1, p = exp(-inf) = 0) with no NaN to guard.
    m = torch.full((nseg * kvh, rows, 1), _FLOOR, device=dev)
    den = torch.zeros(nseg * kvh, rows, 1, device=dev)
    acc = torch.zeros(nseg * kvh, rows, d, device=dev)
    pos_b, low_b = pos_rows[:, None, :, None], low[:, None, :, None]
    for j in range(nblk):
        key = keys[j * kb : (j + 1) * kb]
        hidden = (key > pos_b) | (key < low_b)  # [S, 1, rows, KB]
        if window is not None:
            hidden |= pos_b - key >= window
        scores = invariant_bmm(qf, kf_all[j]).view(nseg, kvh, rows, kb).masked_fill_(
            hidden, float("-inf")).view(nseg * kvh, rows, kb)
        m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
        p = scores.sub_(m_new).exp_()
        alpha = (m - m_new).exp_()
        den = den.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
        acc = acc.mul_(alpha).add_(invariant_bmm(p, vf_all[j]))
        m = m_new
    out = acc.div_(den).view(nseg, kvh, rows, d)[:, :, :real]
    out = out.reshape(nseg, kvh, group, lq, d).permute(0, 3, 1, 2, 4)
    out = out.reshape(nseg, lq, heads, d).to(q.dtype)
    return [out[s, :length] for s, length in enumerate(q_lens)]


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
    """One sequence at a time: a chunk's rows share their padding, and a long chunk next
    to a short one would otherwise pad the short one to its length."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    starts = kv_start.tolist() if kv_start is not None else [0] * len(lens)
    for b, length in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        (out[q0:q1],) = attend_segments(q[q0:q1], k_pool, v_pool, block_tables[b : b + 1],
                                        [length], [q1 - q0], scale, window, [starts[b]])
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
    """Every sequence of the step in one walk over the longest one's key blocks (blocks a
    shorter sequence lacks are masked no-ops for it)."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    lens = seq_lens.tolist()
    starts = kv_start.tolist() if kv_start is not None else [0] * len(lens)
    parts = attend_segments(q, k_pool, v_pool, block_tables, lens, [1] * len(lens), scale,
                            window, starts)
    return torch.cat(parts)
