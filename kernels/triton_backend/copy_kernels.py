"""Triton source of ``write_kv_slots`` (plain function; ``build`` wraps it, see
``attention_kernels``).

One program per new token writes its K and V rows (``[kv_heads, head_dim]``) into their
pool slot. A negative slot is skipped inside the kernel: no host-side filtering, so no
device-to-host sync (the torch reference's boolean indexing needs one).
"""

from __future__ import annotations

import triton.language as tl


def write_kv_slots_kernel(
    k_ptr, v_ptr, k_pool_ptr, v_pool_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_pb, stride_pt, stride_ph,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    dst = ((slot // BLOCK_TOKENS) * stride_pb + (slot % BLOCK_TOKENS) * stride_pt
           + heads[:, None] * stride_ph + dims[None, :])
    t = token.to(tl.int64)
    k = tl.load(k_ptr + t * stride_kt + heads[:, None] * stride_kh + dims[None, :] * stride_kd,
                mask=mask)
    v = tl.load(v_ptr + t * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd,
                mask=mask)
    tl.store(k_pool_ptr + dst, k.to(k_pool_ptr.dtype.element_ty), mask=mask)
    tl.store(v_pool_ptr + dst, v.to(v_pool_ptr.dtype.element_ty), mask=mask)
