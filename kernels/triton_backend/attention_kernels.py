"""Triton source of paged attention: one kernel for prefill and decode, one split merge.

These are plain functions; ``kernels.triton_backend.build`` wraps them for the compiler or
for the interpreter, so a process can hold both and nothing depends on when
``TRITON_INTERPRET`` was set. They call no other jitted function for the same reason (a
helper's wrapper would be fixed to one mode by its module global).

One program serves one tile of a sequence's query rows, for all query heads of one KV head
(grouped-query rows are folded into the tile, so each K/V tile is loaded once per group),
over one split of the visible keys. Rows are ``BLOCK_Q`` tokens × ``BLOCK_G`` heads. Keys
are visited in tiles of ``BLOCK_N`` tokens whose pool rows are found through the block
table per token (``col // BLOCK_TOKENS``), so a tile may span several pool blocks and the
tile size does not depend on the block size.

Scores are kept in base 2 (``scale · log2 e`` folded in). With one split the program
writes the normalised output; with several it writes each split's normalised partial
output and its log-sum-exp, and ``merge_splits_kernel`` combines them (split-KV, as flash
decoding does, so a long context is read by many programs at once).
"""

from __future__ import annotations

import triton.language as tl


def paged_attention_kernel(
    q_ptr, k_pool_ptr, v_pool_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    cu_seqlens_ptr, block_tables_ptr, seq_lens_ptr, kv_start_ptr,
    scale_log2, window, split_tokens, num_splits, num_heads,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh, stride_table,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_DECODE: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KV_START: tl.constexpr,
    SPLIT: tl.constexpr, DOT_F32: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    if IS_DECODE:
        q_first = seq
        q_len = 1
    else:
        q_first = tl.load(cu_seqlens_ptr + seq)
        q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_first
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_Q * BLOCK_G)
    row_tok = tile * BLOCK_Q + rows // BLOCK_G
    row_g = rows % BLOCK_G
    row_ok = (row_tok < q_len) & (row_g < GROUP)
    head = kv_head * GROUP + row_g
    pos = seq_len - q_len + row_tok  # each row's position in its sequence
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_first + row_tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    )

    # The tile's visible keys: from kv_start (and the first row's window edge) up to the
    # last row's position. Splits start at a BLOCK_N-aligned base so tiles cover whole
    # pool blocks when BLOCK_N is a multiple of the block size.
    first_pos = seq_len - q_len + tile * BLOCK_Q
    kv_end = tl.minimum(first_pos + BLOCK_Q, seq_len)
    kv_first = first_pos * 0
    if HAS_KV_START:
        kv_first = tl.load(kv_start_ptr + seq) + first_pos * 0
    if HAS_WINDOW:
        kv_first = tl.maximum(kv_first, first_pos - window + 1)
    lo = kv_first - kv_first % BLOCK_N + split * split_tokens
    hi = tl.minimum(lo + split_tokens, kv_end)

    m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_Q * BLOCK_G], 0.0, tl.float32)
    acc = tl.full([BLOCK_Q * BLOCK_G, BLOCK_D], 0.0, tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_table
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = (cols >= kv_first) & (cols < hi)
        block = tl.load(table_row + cols // BLOCK_TOKENS, mask=col_ok, other=0)
        tok = block.to(tl.int64) * stride_kb + (cols % BLOCK_TOKENS) * stride_kt
        tok += kv_head * stride_kh
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k_t = tl.load(k_pool_ptr + tok[None, :] + dims[:, None],
                      mask=col_ok[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_pool_ptr + tok[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k_t.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k_t)
        s = s * scale_log2
        visible = col_ok[None, :] & (cols[None, :] <= pos[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[:, None] - cols[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift it by 0 instead so that
        # exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DOT_F32:
            pv = p.to(v.dtype).to(tl.float32)
            acc += tl.dot(pv, v.to(tl.float32), input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    store_mask = row_ok[:, None] & dim_ok[None, :]
    if SPLIT:
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        slot = (q_rows * num_heads + head) * num_splits + split
        tl.store(part_lse_ptr + slot, lse, mask=row_ok)
        tl.store(part_o_ptr + slot[:, None] * HEAD_DIM + dims[None, :], o, mask=store_mask)
    else:
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh
                 + dims[None, :], o.to(out_ptr.dtype.element_ty), mask=store_mask)


def merge_splits_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, num_splits, num_heads, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (query row, head): the softmax-weighted sum of its splits."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    base = (row.to(tl.int64) * num_heads + head) * num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    # Each lane folds in every BLOCK_S-th split; the lanes are combined at the end.
    m_lane = tl.full([BLOCK_S], float("-inf"), tl.float32)
    l_lane = tl.full([BLOCK_S], 0.0, tl.float32)
    acc = tl.full([BLOCK_S, BLOCK_D], 0.0, tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        splits = s0 + tl.arange(0, BLOCK_S)
        ok = splits < num_splits
        lse = tl.load(part_lse_ptr + base + splits, mask=ok, other=float("-inf"))
        o = tl.load(part_o_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
                    mask=ok[:, None] & dim_ok[None, :], other=0.0)
        m_new = tl.maximum(m_lane, lse)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_lane - m_use)
        w = tl.exp2(lse - m_use)
        acc = acc * alpha[:, None] + w[:, None] * o
        l_lane = l_lane * alpha + w
        m_lane = m_new
    m = tl.max(m_lane, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(m_lane - m_use)
    total = tl.sum(l_lane * w, 0)
    o = tl.sum(acc * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + dims,
             o.to(out_ptr.dtype.element_ty), mask=dim_ok)
