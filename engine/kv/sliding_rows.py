"""The hybrid pool's side of indexing and store copies: which pages hold a block's rows of
each KV group, which indexed blocks keep their sliding rows, and where a store load's
sliding rows land. Helpers of the KV manager (``engine.kv.kv_manager``) over its sliding
tables (``engine.kv.sliding_tables``); a one-group pool never calls the last two."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.kv.block_manager import BlockManager, Owner
from engine.kv.block_pool import KVBlock
from engine.kv.cache import KVCache
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.sliding_tables import NoSlidingTables, SlidingTables
from kvstore.keys import Key


def row_pages(sliding: SlidingTables | NoSlidingTables, seq_id: int, table: Sequence[KVBlock],
              indices: Sequence[int]) -> dict[int, list[int]]:
    """Per KV group, the pages holding chain blocks ``indices`` (group 0: the table's
    blocks; a sliding group: the companion's page, the null page for blocks without sliding
    rows), for copies in the store's layout (``KVCache.read_rows``)."""
    out = {0: [table[i].block_id for i in indices]}
    if isinstance(sliding, SlidingTables):
        held = sliding.held(seq_id)
        comps = [held.get(i) or (sliding.companion(seq_id, i, table[i])
                                 if sliding.has_rows(table[i]) else None) for i in indices]
        for k in range(sliding.num_groups):
            out[k + 1] = [sliding.null_page if c is None else c.pages[k] for c in comps]
    return out


def index_computed(blocks: BlockManager, sliding: SlidingTables, planner: ReplayPlanner,
                   owner: Owner, seq_id: int, keys: Sequence[Key], start: int, end: int,
                   token_ids: Sequence[int]) -> None:
    """Index blocks ``[start, end)`` of a request that computed every layer of them. A
    block records the sliding layers only while the request's companion for it can be
    attached (a block that left the window before it was indexed records the full ones)."""
    table, held = blocks.table(owner), sliding.held(seq_id)
    for i in range(start, end):
        layers = planner.computed_layers if i in held else planner.primary_layers
        blocks.cache(owner, keys, i, i + 1, layers, token_ids)
        b = table[i]
        if (b.key == keys[i] and planner.has_sliding(b) and not sliding.attach(seq_id, i, b)
                and not sliding.has_rows(b)):
            b.layers -= planner.sliding_layers


def land_sliding_rows(sliding: SlidingTables, cache: KVCache, planner: ReplayPlanner,
                      seq_id: int, table: Sequence[KVBlock], keys: Sequence[Key],
                      loaded: Sequence[int], rows: torch.Tensor | None) -> set[int]:
    """A store load fetched the sliding rows of chain blocks ``loaded`` (row ``j`` of
    ``rows`` for ``loaded[j]``; the loader thread does not own pages): copy them into
    companions given here and attached to the blocks. Returns the blocks that got them
    (no page left: a block stays without, and the replay plan shortens the hit)."""
    got: set[int] = set()
    if rows is None:
        return got
    layers = sorted(planner.sliding_layers)
    for j, i in enumerate(loaded):
        c = sliding.adopt(seq_id, i, table[i]) if table[i].key == keys[i] else None
        if c is not None:
            cache.write_rows({g + 1: [p] for g, p in enumerate(c.pages)}, layers,
                             rows[j:j + 1])
            got.add(i)
    return got
