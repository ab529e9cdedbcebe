"""The paged KV memory of one engine: per layer, K and V pools of
``[num_blocks, block_tokens, kv_heads, head_dim]`` (the HBM tier).

One allocation backs every layer (``[layers, 2, num_blocks, …]``) so the whole pool is a
single tensor to size, pin or free; layers see their own contiguous views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        """All layers' K and V of one block."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.block_tokens * self.kv_heads * self.head_dim * elem


@dataclass
class KVCache:
    shape: KVCacheShape
    device: torch.device
    storage: torch.Tensor = field(init=False, repr=False)
    k: list[torch.Tensor] = field(init=False, repr=False)
    v: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.shape
        self.storage = torch.zeros(
            s.num_layers, 2, s.num_blocks, s.block_tokens, s.kv_heads, s.head_dim,
            dtype=s.dtype, device=self.device,
        )
        self.k = [self.storage[i, 0] for i in range(s.num_layers)]
        self.v = [self.storage[i, 1] for i in range(s.num_layers)]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every layer's K and V of block ``src`` into block ``dst`` for each pair:
        one indexed copy over the whole pool tensor."""
        if not pairs:
            return
        src = torch.tensor([a for a, _ in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([b for _, b in pairs], dtype=torch.int64, device=self.device)
        self.storage.index_copy_(2, dst, self.storage.index_select(2, src))

