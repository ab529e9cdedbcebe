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

Slower than the reference (a Python iteration per 64 keys, no flash kernel): the price of
``--deterministic``, measured in bench/RESULTS.md.
"""

from __future__ import annotations

import torch

from kernels.invariant.matmul import ROW_TILE, invariant_bmm

#: Keys per online-softmax step; fixed, so a row's reduction order never depends on the
#: pool's block size or on the chunking.
KEY_BLOCK_TOKENS = 64


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
    lp = max(ROW_TILE, -(-max(q_lens) // ROW_TILE) * ROW_TILE)
    dev = q.device
    # [S, Lp] row r of segment s is query row cu[s] + r; padded rows repeat the segment's
    # last row (its query and position: they see keys, stay finite, and are dropped).
    n = torch.tensor(q_lens, dtype=torch.int64, device=dev)[:, None]
    cu = torch.cumsum(n, 0) - n
    r = torch.minimum(torch.arange(lp, device=dev)[None, :], n - 1)
    qs = q.index_select(0, (cu + r).flatten()).float().view(nseg, lp, heads, d)
    pos = torch.tensor(seq_lens, dtype=torch.int64, device=dev)[:, None] - n + r
    qf = (qs.view(nseg, lp, kvh, group, d).permute(0, 2, 3, 1, 4)
          .reshape(nseg * kvh, group * lp, d))
    lo = torch.tensor(kv_starts, dtype=torch.int64, device=dev)[:, None]  # [S, 1]
    low = lo.expand(nseg, lp) if window is None else torch.maximum(lo, pos - window + 1)
    first = int(low.min()) // KEY_BLOCK_TOKENS
    last = (max(seq_lens) - 1) // KEY_BLOCK_TOKENS
    tables = block_tables.to(torch.int64)
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=dev)[:, None]
    flat_k = k_pool.view(-1, kvh, d)
    flat_v = v_pool.view(-1, kvh, d)
    rows = group * lp
    m = torch.full((nseg * kvh, rows, 1), float("-inf"), device=dev)
    den = torch.zeros(nseg * kvh, rows, 1, device=dev)
    acc = torch.zeros(nseg * kvh, rows, d, device=dev)
    # Every key the walk reads, gathered once in the pool's dtype: [S, blocks × KB].
    # Positions past a sequence's end read its first slot (any valid one) and are masked.
    kb = KEY_BLOCK_TOKENS
    all_keys = torch.arange(first * kb, (last + 1) * kb, device=dev)
    safe = torch.where(all_keys[None, :] < lens, all_keys[None, :], 0)
    slots = (tables.gather(1, safe // bt) * bt + safe % bt).flatten()
    k_all = flat_k.index_select(0, slots).view(nseg, -1, kvh, d)
    v_all = flat_v.index_select(0, slots).view(nseg, -1, kvh, d)
    for j in range(first, last + 1):
        c = (j - first) * kb
        keys = all_keys[c : c + kb]  # [KB] absolute positions
        kf = k_all[:, c : c + kb].permute(0, 2, 3, 1).float().reshape(nseg * kvh, d, kb)
        vf = v_all[:, c : c + kb].permute(0, 2, 1, 3).float().reshape(nseg * kvh, kb, d)
        visible = (keys[None, None, :] <= pos[:, :, None]) & (keys[None, None, :]
                                                               >= low[:, :, None])
        if window is not None:
            visible &= pos[:, :, None] - keys[None, None, :] < window
        scores = invariant_bmm(qf, kf).mul_(scale)
        scores = scores.view(nseg, kvh, group, lp, kb).masked_fill_(
            ~visible[:, None, None], float("-inf")).view(nseg * kvh, rows, kb)
        m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
        # Nothing seen yet (max still -inf): subtract 0, so exp gives 0 for masked keys
        # rather than NaN.
        m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        p = torch.exp(scores - m_safe)
        alpha = torch.exp(m - m_safe)
        den = den * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + invariant_bmm(p, vf)
        m = m_new
    out = (acc / den).view(nseg, kvh, group, lp, d).permute(0, 3, 1, 2, 4)
    out = out.reshape(nseg, lp, heads, d).to(q.dtype)
    return [out[s, :n] for s, n in enumerate(q_lens)]


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
