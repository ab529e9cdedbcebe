"""The kernel entry points the engine calls: validate, pick a backend, launch.

Every function takes ``backend=`` (a registered name or a backend object); by default the
tensors' device decides (``triton`` on a GPU or NPU, ``torch`` elsewhere). Arguments are
checked before launch (``kernels.checks``): shapes, dtypes, strides and the block-table
entries each sequence uses.

A model runs the same metadata through every layer of a step, so its caller may validate it
once (``check_step_metadata``) and pass ``validated=True`` to each layer's call, which then
skips the checks that read the metadata's values (the host syncs). ``KERNELS_DEBUG_CHECKS=1``
re-enables every check on every call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from kernels import checks
from kernels.backend import AttentionBackend, resolve_backend
from kernels.errors import KernelArgumentError

Backend = str | AttentionBackend | None


def debug_checks() -> bool:
    """Whether every call re-checks its metadata even when told it was validated."""
    return os.environ.get("KERNELS_DEBUG_CHECKS") == "1"


def check_step_metadata(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_tokens: int,
    slot_mapping: torch.Tensor,
    prefill: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    extra_slot_mapping: torch.Tensor | None = None,
) -> None:
    """Everything about one step's metadata that the per-layer calls skip when passed
    ``validated=True``: the slots inside the pool, the block tables covering each sequence
    inside the pool, ``kv_start`` leaving each query itself. ``prefill`` is ``(cu_seqlens_q,
    block_tables, seq_lens, kv_start)`` and ``decode`` ``(block_tables, seq_lens,
    kv_start)``; ``num_tokens`` rows, prefill rows first."""
    pool = checks.check_pools(k_pool, v_pool)
    for slots in (slot_mapping, extra_slot_mapping):
        if slots is not None:
            _check_slots(slots, num_tokens, pool, k_pool.device)
    n_pre = 0
    if prefill is not None:
        cu, tables, lens, kv_start = prefill
        n_pre = int(cu[-1]) if cu.numel() else 0
        q_lens = checks.check_cu_seqlens(cu, n_pre, k_pool.device)
        checks.check_sequences(pool, k_pool.device, tables, lens, q_lens, kv_start)
    if decode is not None:
        tables, lens, kv_start = decode
        checks.check_sequences(pool, k_pool.device, tables, lens, [1] * (num_tokens - n_pre),
                               kv_start)
    elif n_pre != num_tokens:
        raise KernelArgumentError(f"the prefill covers {n_pre} of the step's {num_tokens} rows "
                                  "and there is no decode metadata for the rest")


def _check_slots(slot_mapping: torch.Tensor, tokens: int, pool: checks.PoolShape,
                 device: torch.device) -> None:
    checks.check_index(slot_mapping, "slot_mapping", 1, device)
    if slot_mapping.shape[0] != tokens:
        raise KernelArgumentError(f"slot_mapping has {slot_mapping.shape[0]} entries for "
                                  f"{tokens} tokens")
    slots = pool.num_blocks * pool.block_tokens
    if slot_mapping.numel() and int(slot_mapping.max()) >= slots:
        raise KernelArgumentError(f"slot_mapping holds {int(slot_mapping.max())}, beyond the "
                                  f"pool's {slots} slots")


def write_kv_slots(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: Backend = None,
    validated: bool = False,
) -> None:
    """Store new tokens' K/V (``[tokens, kv_heads, head_dim]``) at their flat pool slots
    (``block_id × block_tokens + offset``; negative slots are skipped), as vLLM's
    ``reshape_and_cache``."""
    if validated and not debug_checks():
        resolve_backend(backend, k_pool.device).write_kv_slots(k, v, k_pool, v_pool,
                                                               slot_mapping)
        return
    pool = checks.check_pools(k_pool, v_pool)
    want = (pool.kv_heads, pool.head_dim)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or tuple(t.shape[1:]) != want:
            raise KernelArgumentError(f"{name} must be [tokens, {want[0]}, {want[1]}], got "
                                      f"{checks._describe(t)}")
        if t.device != k_pool.device:
            raise KernelArgumentError(f"{name} is on {t.device} but the pool is on "
                                      f"{k_pool.device}")
    checks.check_index(slot_mapping, "slot_mapping", 1, k_pool.device)
    if k.shape[0] != v.shape[0] or slot_mapping.shape[0] != k.shape[0]:
        raise KernelArgumentError(f"k ({k.shape[0]}), v ({v.shape[0]}) and slot_mapping "
                                  f"({slot_mapping.shape[0]}) must have one entry per token")
    _check_slots(slot_mapping, k.shape[0], pool, k_pool.device)
    resolve_backend(backend, k_pool.device).write_kv_slots(k, v, k_pool, v_pool, slot_mapping)


def paged_prefill_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    kv_start: torch.Tensor | None = None,
    *,
    backend: Backend = None,
    validated: bool = False,
) -> torch.Tensor:
    """A ragged batch of prefill chunks: ``q[cu[b]:cu[b+1]]`` (``[tokens, heads, head_dim]``)
    are the last tokens of sequence ``b`` (``seq_lens[b]`` tokens, KV already written to
    its pool slots, chunk included) and attend causally to the whole sequence through
    ``block_tables[b]`` (bottom-right alignment). ``window``: key ``j`` is visible to query
    ``i`` iff ``i − j < window`` (transformers' convention). ``kv_start[b]``: positions
    before it have no KV (bounded replay). Returns ``[tokens, heads, head_dim]``."""
    if validated and not debug_checks():
        return resolve_backend(backend, q.device).paged_prefill_attention(
            q, k_pool, v_pool, cu_seqlens_q, block_tables, seq_lens, float(scale), window,
            kv_start)
    pool = checks.check_pools(k_pool, v_pool)
    checks.check_query(q, pool, k_pool)
    q_lens = checks.check_cu_seqlens(cu_seqlens_q, q.shape[0], q.device)
    checks.check_scale(scale)
    checks.check_window(window)
    checks.check_sequences(pool, q.device, block_tables, seq_lens, q_lens, kv_start)
    return resolve_backend(backend, q.device).paged_prefill_attention(
        q, k_pool, v_pool, cu_seqlens_q, block_tables, seq_lens, float(scale), window, kv_start
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    kv_start: torch.Tensor | None = None,
    *,
    backend: Backend = None,
    validated: bool = False,
) -> torch.Tensor:
    """One new token per sequence (``q`` is ``[batch, heads, head_dim]``, the token at
    position ``seq_lens[b] − 1`` whose KV is already in the pool); ragged lengths."""
    if validated and not debug_checks():
        return resolve_backend(backend, q.device).paged_decode_attention(
            q, k_pool, v_pool, block_tables, seq_lens, float(scale), window, kv_start)
    pool = checks.check_pools(k_pool, v_pool)
    checks.check_query(q, pool, k_pool)
    checks.check_scale(scale)
    checks.check_window(window)
    checks.check_sequences(pool, q.device, block_tables, seq_lens, [1] * q.shape[0], kv_start)
    return resolve_backend(backend, q.device).paged_decode_attention(
        q, k_pool, v_pool, block_tables, seq_lens, float(scale), window, kv_start
    )


def read_kv_blocks(
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    block_ids: torch.Tensor,
    layers: Sequence[int],
    out: torch.Tensor,
    *,
    backend: Backend = None,
) -> None:
    """Copy pool blocks ``block_ids`` of ``layers`` into ``out``, the store's payload layout
    ``[n, len(layers), 2, block_tokens, kv_heads, head_dim]`` (K then V per layer)."""
    checks.check_block_copy(k_pools, v_pools, block_ids, layers, out, "out")
    resolve_backend(backend, k_pools[0].device).read_kv_blocks(
        k_pools, v_pools, block_ids, layers, out
    )


def write_kv_blocks(
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    block_ids: torch.Tensor,
    layers: Sequence[int],
    src: torch.Tensor,
    *,
    backend: Backend = None,
) -> None:
    """Copy store payloads ``src`` (layout as ``read_kv_blocks``) into pool blocks."""
    checks.check_block_copy(k_pools, v_pools, block_ids, layers, src, "src")
    resolve_backend(backend, k_pools[0].device).write_kv_blocks(
        k_pools, v_pools, block_ids, layers, src
    )
