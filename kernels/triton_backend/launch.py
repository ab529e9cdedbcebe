"""The arguments of each kernel launch, built in one place for the backend and for the
ahead-of-time compile check (which compiles exactly what the backend would launch)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.triton_backend.plan import AttentionPlan, next_pow2

LOG2E = 1.4426950408889634

#: Scalar arguments Triton's JIT must not specialise on (it compiles a variant per value
#: that is 1 or a multiple of 16): they change per batch and buy nothing specialised.
#: Strides stay specialised: their divisibility lets loads vectorise.
NOT_SPECIALIZED = {
    "paged_attention_kernel": ("scale_log2", "window", "split_tokens", "num_splits",
                               "num_heads"),
    "merge_splits_kernel": ("num_splits", "num_heads"),
    "write_kv_slots_kernel": (),
}


@dataclass(frozen=True, slots=True)
class Launch:
    grid: tuple[int, ...]
    args: tuple[object, ...]
    constexprs: dict[str, object]
    options: dict[str, int] = field(default_factory=dict)


def attention_launch(
    plan: AttentionPlan,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # any index tensor when decoding (unread)
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_start: torch.Tensor | None,
    scale: float,
    window: int | None,
    *,
    decode: bool,
    interpret: bool,
) -> Launch:
    _, bt, kvh, head_dim = k_pool.shape
    # The interpreter multiplies bfloat16 tiles as raw integers (Triton 3.9), so it is
    # given float32 operands: the same products, as bfloat16 × bfloat16 is exact in float32.
    dot_f32 = q.dtype == torch.float32 or (interpret and q.dtype == torch.bfloat16)
    args = (
        q, k_pool, v_pool, out, part_o, part_lse,
        cu_seqlens_q, block_tables, seq_lens, kv_start if kv_start is not None else seq_lens,
        scale * LOG2E, window or 0, plan.split_tokens, plan.num_splits, q.shape[1],
        q.stride(0), q.stride(1), *k_pool.stride()[:3], out.stride(0), out.stride(1),
        block_tables.stride(0),
    )
    constexprs: dict[str, object] = dict(
        GROUP=q.shape[1] // kvh, HEAD_DIM=head_dim, BLOCK_TOKENS=bt,
        BLOCK_Q=plan.block_q, BLOCK_G=plan.block_g, BLOCK_N=plan.block_n,
        BLOCK_D=plan.block_d, IS_DECODE=decode, HAS_WINDOW=window is not None,
        HAS_KV_START=kv_start is not None, SPLIT=plan.num_splits > 1, DOT_F32=dot_f32,
    )
    return Launch(plan.grid, args, constexprs,
                  dict(num_warps=plan.num_warps, num_stages=plan.num_stages))


def merge_launch(
    plan: AttentionPlan, part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor
) -> Launch:
    tokens, heads, splits, head_dim = part_o.shape
    return Launch(
        (tokens, heads),
        (part_o, part_lse, out, splits, heads, out.stride(0), out.stride(1)),
        dict(HEAD_DIM=head_dim, BLOCK_S=min(16, next_pow2(splits)), BLOCK_D=plan.block_d),
        dict(num_warps=1 if plan.block_d <= 64 else 2),
    )


def write_slots_launch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> Launch:
    _, bt, kvh, head_dim = k_pool.shape
    return Launch(
        (k.shape[0],),
        (k, v, k_pool, v_pool, slot_mapping, *k.stride(), *v.stride(), *k_pool.stride()[:3]),
        dict(KV_HEADS=kvh, HEAD_DIM=head_dim, BLOCK_TOKENS=bt, BLOCK_H=next_pow2(kvh),
             BLOCK_D=next_pow2(head_dim)),
        dict(num_warps=1 if kvh * head_dim <= 512 else 4),
    )
