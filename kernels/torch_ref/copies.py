"""KV copies in plain torch: new tokens into pool slots, pool blocks to and from the store's
payload layout ``[n, len(layers), 2, block_tokens, kv_heads, head_dim]`` (DESIGN §4).

One indexed copy per layer and K/V, never a Python loop per block; the payload may live on
another device (pinned host memory for the store), and the copy crosses devices then.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def write_kv_slots(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    flat_k = k_pool.view(-1, k_pool.shape[2], k_pool.shape[3])
    flat_v = v_pool.view(-1, v_pool.shape[2], v_pool.shape[3])
    flat_k.index_copy_(0, slots, k.to(k_pool.dtype))
    flat_v.index_copy_(0, slots, v.to(v_pool.dtype))


def read_kv_blocks(
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    block_ids: torch.Tensor,
    layers: Sequence[int],
    out: torch.Tensor,
) -> None:
    ids = block_ids.to(torch.int64)
    non_blocking = out.device.type == "cpu" and out.is_pinned()
    for i, layer in enumerate(layers):
        out[:, i, 0].copy_(k_pools[layer].index_select(0, ids), non_blocking=non_blocking)
        out[:, i, 1].copy_(v_pools[layer].index_select(0, ids), non_blocking=non_blocking)
    if non_blocking and k_pools[0].device.type != "cpu":
        # The caller hands ``out`` to the store next: it must hold the bytes by then.
        device = k_pools[0].device  # cuda, or npu through torch_npu
        torch.get_device_module(device).current_stream(device).synchronize()


def write_kv_blocks(
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    block_ids: torch.Tensor,
    layers: Sequence[int],
    src: torch.Tensor,
) -> None:
    device = k_pools[0].device
    ids = block_ids.to(device=device, dtype=torch.int64)
    staged = src.to(device, non_blocking=src.device.type == "cpu" and src.is_pinned())
    for i, layer in enumerate(layers):
        k_pools[layer].index_copy_(0, ids, staged[:, i, 0])
        v_pools[layer].index_copy_(0, ids, staged[:, i, 1])
