"""vLLM's paged KV of one layer <-> store blocks (DESIGN §4 payload), for any block sizes.

vLLM's CPU attention keeps a layer as ``[num_blocks, kv_heads, block_size, 2 × head_dim]``,
each (block, head) area holding its K then its V, but the order *inside* an area depends on
the kernel chosen at run time (K is transposed for the ``vec`` kernels and VNNI-packed for
AMX, V is packed for AMX). Rather than copy those rules, ``probe_layout`` writes numbered
K and V through vLLM's own cache-write op into a scratch block and reads where each element
landed: the permutation is measured, never assumed, and a write that is not a pure
permutation refuses the layout. Moving tokens is then one ``index_put_``/``take`` with
precomputed flat indices, the same for every layer.

A store block is ``[layers, 2, block_tokens, kv_heads, head_dim]`` per block (K, V); vLLM's
block size need not equal the store's: tokens are placed one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (key [n, H, D], value [n, H, D], kv_layer [nb, H, bs, 2D], slots [n]) -> None
CacheWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]

# Integers a dtype holds exactly: numbered probes are written in digits below this.
_EXACT_INT = {torch.float32: 1 << 24, torch.float16: 2048, torch.bfloat16: 256}


class LayoutError(ValueError):
    """vLLM's KV cache is not something the connector can convert (one line)."""


@dataclass(frozen=True)
class PagedLayout:
    block_size: int  # vLLM tokens per block
    kv_heads: int
    head_dim: int
    # [block_size, head_dim]: where logical K[t, d] / V[t, d] sit in a (block, head) area
    # of 2 × block_size × head_dim elements (V's positions include the K half before it).
    k_pos: torch.Tensor
    v_pos: torch.Tensor

    @property
    def area_elems(self) -> int:
        return 2 * self.block_size * self.head_dim

    def flat_index(self, block_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``[2, n, kv_heads, head_dim]`` flat element indices into one layer's cache of the
        K and V of ``n`` tokens at (``block_ids[i]``, ``offsets[i]``)."""
        area = self.area_elems
        base = (block_ids.to(torch.int64) * (self.kv_heads * area)).view(-1, 1, 1)
        heads = (torch.arange(self.kv_heads, dtype=torch.int64) * area).view(1, -1, 1)
        k = base + heads + self.k_pos[offsets].unsqueeze(1)
        v = base + heads + self.v_pos[offsets].unsqueeze(1)
        return torch.stack((k, v))

    def check_layer(self, kv_layer: torch.Tensor) -> None:
        shape = tuple(kv_layer.shape)
        if (len(shape) != 4 or shape[1:] != (self.kv_heads, self.block_size, 2 * self.head_dim)
                or not kv_layer.is_contiguous()):
            raise LayoutError(
                f"KV cache layer of shape {shape} is not [blocks, {self.kv_heads}, "
                f"{self.block_size}, {2 * self.head_dim}] contiguous (vLLM's CPU layout)"
            )


def token_slots(block_ids: list[int], start: int, end: int,
                block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(vLLM block id, offset) of tokens ``[start, end)`` of a request whose blocks are
    ``block_ids``."""
    pos = torch.arange(start, end, dtype=torch.int64)
    table = torch.tensor(block_ids, dtype=torch.int64)
    return table[pos // block_size], pos % block_size


def write_tokens(kv_layer: torch.Tensor, index: torch.Tensor, kv: torch.Tensor) -> None:
    """Put ``kv`` (``[2, n, H, D]``, K then V of n tokens) at ``index`` (``flat_index``)."""
    kv_layer.view(-1).index_put_((index.view(-1),), kv.reshape(-1).to(kv_layer.dtype))


def read_tokens(kv_layer: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``[2, n, H, D]``: the K and V at ``index``."""
    return kv_layer.view(-1).take(index)


def probe_layout(write: CacheWriter, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> PagedLayout:
    """Measure where ``write`` (vLLM's cache-write op) puts each element of one block."""
    limit = _EXACT_INT.get(dtype)
    if limit is None:
        raise LayoutError(f"KV cache dtype {dtype} is not float32, float16 or bfloat16")
    n = block_size * head_dim
    number = torch.arange(n, dtype=torch.int64)
    # Digits 1..radix (0 stays "not written"); the K numbers and the V numbers are
    # offset by n so one area tells K and V apart.
    radix = limit - 1
    found = torch.zeros(2 * n, dtype=torch.int64)
    scale = 1
    total = 2 * n
    while scale < total:
        digits_k = (number // scale) % radix + 1
        digits_v = ((number + n) // scale) % radix + 1
        layer = torch.zeros(1, 1, block_size, 2 * head_dim, dtype=dtype)
        key = digits_k.view(block_size, 1, head_dim).to(dtype)
        val = digits_v.view(block_size, 1, head_dim).to(dtype)
        write(key, val, layer, torch.arange(block_size, dtype=torch.int64))
        got = layer.reshape(-1).to(torch.int64)
        if bool((got < 1).any()) or bool((got > radix).any()):
            raise LayoutError("vLLM's KV cache write is not a permutation of its input")
        found += (got - 1) * scale
        scale *= radix
    if not torch.equal(torch.sort(found).values, torch.arange(total)):
        raise LayoutError("vLLM's KV cache write is not a permutation of its input")
    pos = torch.empty(total, dtype=torch.int64)
    pos[found] = torch.arange(total, dtype=torch.int64)
    return PagedLayout(
        block_size=block_size, kv_heads=kv_heads, head_dim=head_dim,
        k_pos=pos[:n].view(block_size, head_dim).contiguous(),
        v_pos=pos[n:].view(block_size, head_dim).contiguous(),
    )


def cpu_cache_writer(dtype: torch.dtype, block_size: int, head_dim: int) -> CacheWriter:
    """vLLM's CPU cache-write op with the kernel (ISA) vLLM picks for these shapes (imports
    vLLM: only the connector calls it)."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(dtype, block_size, head_dim, "auto")

    def write(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor,
              slots: torch.Tensor) -> None:
        blocks, heads, size, _ = kv.shape
        k_cache, v_cache = kv.view(blocks, heads, 2 * size, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, value, k_cache, v_cache, slots, isa,
                                       k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")

    return write
