"""The paged KV memory of one engine (the HBM tier): one tensor of pages
``[unit_layers, 2, num_pages, block_tokens, kv_heads, head_dim]``.

A page holds one block of tokens of ``unit_layers`` layers (``engine.kv.kv_groups``). For a
model without sliding layers that is every layer, so a page is a whole block and this is
the pool it always was. For a hybrid model the full-attention group and each sliding group
take their own page per block from the same pages, and a sliding group gives its pages
back when they fall out of the window. Layer ``l`` sees row ``slot_of(l)`` as its
``[num_pages, block_tokens, kv_heads, head_dim]`` pools (``k[l]``, ``v[l]``), indexed with
its group's block table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import kernels
from engine.kv.kv_groups import KVGroupLayout


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int  # pages (== blocks when the layout has one group)
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    layout: KVGroupLayout | None = None  # None: one group of every layer

    @property
    def groups(self) -> KVGroupLayout:
        return self.layout if self.layout is not None else KVGroupLayout.single(self.num_layers)

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_page(self) -> int:
        u = self.groups.unit_layers
        return u * 2 * self.block_tokens * self.kv_heads * self.head_dim * self.element_bytes

    @property
    def bytes_per_block(self) -> int:
        """All layers' K and V of one block."""
        return self.num_layers * 2 * self.block_tokens * self.kv_heads * self.head_dim \
            * self.element_bytes


@dataclass
class KVCache:
    shape: KVCacheShape
    device: torch.device
    storage: torch.Tensor = field(init=False, repr=False)
    k: list[torch.Tensor] = field(init=False, repr=False)
    v: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.shape
        groups = s.groups
        if groups.num_layers != s.num_layers:
            raise ValueError(f"KV groups cover {groups.num_layers} layers, the model "
                             f"{s.num_layers}")
        self.storage = torch.zeros(
            groups.unit_layers, 2, s.num_blocks, s.block_tokens, s.kv_heads, s.head_dim,
            dtype=s.dtype, device=self.device,
        )
        slots = [groups.slot_of(i) for i in range(s.num_layers)]
        self.k = [self.storage[slots[i], 0] for i in range(s.num_layers)]
        self.v = [self.storage[slots[i], 1] for i in range(s.num_layers)]

    @property
    def layout(self) -> KVGroupLayout:
        return self.shape.groups

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every row of page ``src`` into page ``dst`` for each pair: one indexed copy
        over the whole pool tensor."""
        if not pairs:
            return
        src = torch.tensor([a for a, _ in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([b for _, b in pairs], dtype=torch.int64, device=self.device)
        self.storage.index_copy_(2, dst, self.storage.index_select(2, src))

    # -- copies to and from the store's payload layout, per KV group --------------------
    def read_rows(self, pages: dict[int, list[int]], layers: list[int], out: torch.Tensor,
                  backend: str | kernels.AttentionBackend | None = None) -> None:
        """Copy ``layers`` of ``n`` blocks into ``out`` (``[n, len(layers), 2, …]``, the
        store's layout): layer ``l``'s rows come from the pages ``pages[group_of(l)]``."""
        for ids, idx in self._by_group(pages, layers, out.shape[0]):
            sub = [layers[j] for j in idx]
            if len(idx) == len(layers):
                kernels.read_kv_blocks(self.k, self.v, ids, sub, out, backend=backend)
                continue
            part = torch.empty((out.shape[0], len(sub), *out.shape[2:]), dtype=out.dtype,
                               device=out.device)
            kernels.read_kv_blocks(self.k, self.v, ids, sub, part, backend=backend)
            out[:, idx] = part

    def write_rows(self, pages: dict[int, list[int]], layers: list[int], src: torch.Tensor,
                   backend: str | kernels.AttentionBackend | None = None) -> None:
        """The inverse of ``read_rows``: store payload rows ``src`` into the groups' pages."""
        for ids, idx in self._by_group(pages, layers, src.shape[0]):
            sub = [layers[j] for j in idx]
            part = src if len(idx) == len(layers) else src[:, idx].contiguous()
            kernels.write_kv_blocks(self.k, self.v, ids, sub, part, backend=backend)

    def _by_group(self, pages: dict[int, list[int]], layers: list[int],
                  n: int) -> list[tuple[torch.Tensor, list[int]]]:
        layout = self.layout
        out = []
        for g in sorted({layout.group_of(x) for x in layers}):
            if len(pages[g]) != n:
                raise ValueError(f"group {g}: {len(pages[g])} pages for {n} blocks")
            idx = [j for j, x in enumerate(layers) if layout.group_of(x) == g]
            out.append((torch.tensor(pages[g], dtype=torch.int64, device=self.device), idx))
        return out
