"""How the pool's layers are grouped into pages: one group for a model without sliding
layers, else a full-attention group and sliding groups (vLLM v1's KV-cache groups).

A *page* holds ``unit_layers`` layers' K and V of one block of tokens. Every group has
exactly ``unit_layers`` layers, so every group's block is one page of the same size and all
groups draw pages from one shared pool: a page freed by a sliding group (its keys fell out
of the window) serves a full-attention block next. ``unit_layers`` is the number of full-attention
layers, which must divide the sliding ones (Gemma 3 270M: 3 full and 15 sliding layers give
one full group and five sliding groups of 3 layers each), so no group pads; any other
hybrid keeps one group (today's pool).

Layer ``l`` lives in row ``slot[l]`` of the pool tensor; layers of different groups share
a row and are told apart only by the pages their group's block table names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import EngineIntegrityError


@dataclass(frozen=True, slots=True)
class KVGroupLayout:
    """``groups[0]`` is the full-attention group (or every layer, without sliding groups);
    ``groups[1:]`` the sliding groups. ``window_tokens``: the largest sliding window (0
    without sliding groups)."""

    groups: tuple[tuple[int, ...], ...]
    window_tokens: int = 0

    def __post_init__(self) -> None:
        sizes = {len(g) for g in self.groups}
        if not self.groups or len(sizes) != 1 or 0 in sizes:
            raise EngineIntegrityError(f"KV groups must be non-empty and equal: {self.groups}")
        flat = sorted(x for g in self.groups for x in g)
        if flat != list(range(len(flat))):
            raise EngineIntegrityError(f"KV groups must cover each layer once: {self.groups}")
        if (len(self.groups) > 1) != (self.window_tokens > 0):
            raise EngineIntegrityError("sliding groups and a window go together")

    @staticmethod
    def single(num_layers: int) -> KVGroupLayout:
        """Today's pool: one group of every layer (a page is a whole block)."""
        return KVGroupLayout((tuple(range(num_layers)),))

    @staticmethod
    def for_windows(layer_windows: Sequence[int | None]) -> KVGroupLayout:
        """Hybrid grouping when the model has both kinds of layers, else ``single``."""
        full = [i for i, w in enumerate(layer_windows) if w is None]
        sliding = [i for i, w in enumerate(layer_windows) if w is not None]
        if not full or not sliding:
            return KVGroupLayout.single(len(layer_windows))
        unit = len(full)
        if len(sliding) % unit:
            # Groups of fewer layers than the full ones would need several full tables in
            # lockstep; no model in the catalog needs that, so such a model keeps one group.
            return KVGroupLayout.single(len(layer_windows))
        groups = [tuple(full)] + [tuple(sliding[i:i + unit])
                                  for i in range(0, len(sliding), unit)]
        window = max(w for w in layer_windows if w is not None)
        return KVGroupLayout(tuple(groups), window)

    @property
    def unit_layers(self) -> int:
        return len(self.groups[0])

    @property
    def num_layers(self) -> int:
        return self.unit_layers * len(self.groups)

    @property
    def num_sliding_groups(self) -> int:
        return len(self.groups) - 1

    @property
    def is_hybrid(self) -> bool:
        return self.num_sliding_groups > 0

    @property
    def pages_per_block(self) -> int:
        """Pages one block of tokens takes while every group holds it."""
        return len(self.groups)

    def group_of(self, layer: int) -> int:
        for g, layers in enumerate(self.groups):
            if layer in layers:
                return g
        raise EngineIntegrityError(f"layer {layer} is in no KV group")

    def slot_of(self, layer: int) -> int:
        """The row of the pool tensor holding ``layer``."""
        return self.groups[self.group_of(layer)].index(layer)

    def window_first_block(self, position: int, block_tokens: int) -> int:
        """The first block a sliding layer's query at ``position`` (or later) can see."""
        if not self.is_hybrid:
            return 0
        return max(0, position - self.window_tokens + 1) // block_tokens
