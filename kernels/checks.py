"""Argument checks run before any backend launches.

Every check raises ``KernelArgumentError`` with a message that names the argument. The
block-table check reads only the entries a sequence actually uses (``ceil(seq_len /
block_tokens)`` per row), so padding may hold anything (−1 by convention).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.errors import BlockTableError, KernelArgumentError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True, slots=True)
class PoolShape:
    num_blocks: int
    block_tokens: int
    kv_heads: int
    head_dim: int


def _fail(msg: str) -> KernelArgumentError:
    return KernelArgumentError(msg)


def check_pools(k_pool: torch.Tensor, v_pool: torch.Tensor) -> PoolShape:
    """One layer's K and V pools: 4-D, equal shape, dtype and device, contiguous."""
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if not isinstance(pool, torch.Tensor) or pool.dim() != 4:
            raise _fail(f"{name} must be a 4-D tensor [num_blocks, block_tokens, kv_heads, "
                        f"head_dim], got {_describe(pool)}")
        if pool.dtype not in FLOAT_DTYPES:
            raise _fail(f"{name} dtype {pool.dtype} is not one of float16/bfloat16/float32")
        if not pool.is_contiguous():
            raise _fail(f"{name} must be contiguous (strides {tuple(pool.stride())})")
    if k_pool.shape != v_pool.shape:
        raise _fail(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ")
    if k_pool.dtype != v_pool.dtype or k_pool.device != v_pool.device:
        raise _fail("k_pool and v_pool must share dtype and device")
    nb, bt, kvh, hd = k_pool.shape
    if nb < 1 or bt < 1 or kvh < 1 or hd < 1:
        raise _fail(f"empty pool shape {tuple(k_pool.shape)}")
    return PoolShape(nb, bt, kvh, hd)


def check_query(q: torch.Tensor, pool: PoolShape, like: torch.Tensor) -> int:
    """``q`` is ``[tokens, num_heads, head_dim]`` on the pool's device and dtype; returns
    ``num_heads`` (a multiple of ``kv_heads``)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise _fail(f"q must be a 3-D tensor [tokens, num_heads, head_dim], got {_describe(q)}")
    if q.shape[2] != pool.head_dim:
        raise _fail(f"q head_dim {q.shape[2]} != pool head_dim {pool.head_dim}")
    if q.shape[1] % pool.kv_heads:
        raise _fail(f"q num_heads {q.shape[1]} is not a multiple of kv_heads {pool.kv_heads}")
    if q.dtype != like.dtype:
        raise _fail(f"q dtype {q.dtype} != pool dtype {like.dtype}")
    if q.device != like.device:
        raise _fail(f"q is on {q.device} but the pool is on {like.device}")
    if q.stride(-1) != 1:
        raise _fail("q's last dimension must be contiguous")
    return int(q.shape[1])


def check_index(t: torch.Tensor, name: str, dims: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != dims or t.dtype not in INDEX_DTYPES:
        raise _fail(f"{name} must be a {dims}-D int32/int64 tensor, got {_describe(t)}")
    if t.device != device:
        raise _fail(f"{name} is on {t.device} but the pool is on {device}")


def check_scale(scale: float) -> None:
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise _fail(f"scale must be a positive float, got {scale!r}")


def check_window(window: int | None) -> None:
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        raise _fail(f"window must be None or an integer >= 1, got {window!r}")


def check_sequences(
    pool: PoolShape,
    device: torch.device,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: Sequence[int],
    kv_start: torch.Tensor | None,
) -> None:
    """Block tables cover every sequence and point inside the pool; ``kv_start`` leaves
    every query at least itself."""
    check_index(block_tables, "block_tables", 2, device)
    check_index(seq_lens, "seq_lens", 1, device)
    batch = len(q_lens)
    if block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
        raise _fail(f"block_tables rows {block_tables.shape[0]} and seq_lens "
                    f"{seq_lens.shape[0]} must both equal the batch size {batch}")
    lens = seq_lens.tolist()
    width = block_tables.shape[1]
    for b, (s, ql) in enumerate(zip(lens, q_lens, strict=True)):
        if s < ql:
            raise _fail(f"sequence {b}: seq_len {s} < its {ql} new query tokens")
        if -(-s // pool.block_tokens) > width:
            raise _fail(f"sequence {b}: seq_len {s} needs {-(-s // pool.block_tokens)} "
                        f"blocks but block_tables has {width} columns")
    if batch and width:
        used = torch.arange(width, device=device)[None, :] < (
            (seq_lens.to(torch.int64) + pool.block_tokens - 1) // pool.block_tokens
        )[:, None]
        bad = used & ((block_tables < 0) | (block_tables >= pool.num_blocks))
        if bool(bad.any()):
            b, col = (int(x) for x in bad.nonzero()[0].tolist())
            raise BlockTableError(
                f"block_tables[{b}, {col}] = {int(block_tables[b, col])} is outside the "
                f"pool of {pool.num_blocks} blocks"
            )
    if kv_start is not None:
        check_index(kv_start, "kv_start", 1, device)
        if kv_start.shape[0] != batch:
            raise _fail(f"kv_start has {kv_start.shape[0]} entries for a batch of {batch}")
        for b, (ks, s, ql) in enumerate(zip(kv_start.tolist(), lens, q_lens, strict=True)):
            if ks < 0 or ks > s - ql:
                raise _fail(f"sequence {b}: kv_start {ks} must lie in [0, {s - ql}] (the "
                            f"first query's position), or its queries would see nothing")


def check_cu_seqlens(cu: torch.Tensor, tokens: int, device: torch.device) -> list[int]:
    """Returns the per-sequence query lengths."""
    check_index(cu, "cu_seqlens_q", 1, device)
    if cu.shape[0] < 1:
        raise _fail("cu_seqlens_q must hold batch + 1 offsets")
    offs = cu.tolist()
    if offs[0] != 0 or offs[-1] != tokens:
        raise _fail(f"cu_seqlens_q must start at 0 and end at q's {tokens} tokens, got "
                    f"{offs[0]}..{offs[-1]}")
    q_lens = [b - a for a, b in itertools.pairwise(offs)]
    if any(n < 0 for n in q_lens):
        raise _fail("cu_seqlens_q must be non-decreasing")
    return q_lens


def check_block_copy(
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    block_ids: torch.Tensor,
    layers: Sequence[int],
    payload: torch.Tensor,
    name: str,
) -> PoolShape:
    """Pools of every layer alike; ``payload`` is ``[n, len(layers), 2, block_tokens,
    kv_heads, head_dim]`` in the pools' dtype (any device: copies cross devices)."""
    if len(k_pools) == 0 or len(k_pools) != len(v_pools):
        raise _fail("k_pools and v_pools must be equally long, non-empty per-layer lists")
    shape = check_pools(k_pools[0], v_pools[0])
    for i, (kp, vp) in enumerate(zip(k_pools, v_pools, strict=True)):
        if check_pools(kp, vp) != shape or kp.dtype != k_pools[0].dtype:
            raise _fail(f"layer {i}'s pools differ from layer 0's")
    if not layers or any(not 0 <= li < len(k_pools) for li in layers):
        raise _fail(f"layers {list(layers)} must be non-empty indices into {len(k_pools)} pools")
    check_index(block_ids, "block_ids", 1, k_pools[0].device)
    n = block_ids.shape[0]
    if n and (int(block_ids.min()) < 0 or int(block_ids.max()) >= shape.num_blocks):
        raise BlockTableError(
            f"block_ids must lie in [0, {shape.num_blocks}), got "
            f"{int(block_ids.min())}..{int(block_ids.max())}"
        )
    want = (n, len(layers), 2, shape.block_tokens, shape.kv_heads, shape.head_dim)
    if not isinstance(payload, torch.Tensor) or tuple(payload.shape) != want:
        raise _fail(f"{name} must have shape {want}, got {_describe(payload)}")
    if payload.dtype != k_pools[0].dtype:
        raise _fail(f"{name} dtype {payload.dtype} != pool dtype {k_pools[0].dtype}")
    return shape


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
