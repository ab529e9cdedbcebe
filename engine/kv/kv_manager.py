"""The KV manager: the one object that knows what the pool holds for each request.

As vLLM v1's ``KVCacheManager`` sits over its ``BlockPool``, this sits over the block tables
(``engine.kv.block_manager``) and the pool (``engine.kv.block_pool``) and owns, for every
request, the questions the scheduler and the store connector used to answer themselves:

- **keys**: a request's chain keys (DESIGN §3), in the engine's namespace as the request
  sees it (its tenant and salt), or in a store link's (``keys``);
- **prefix match** (``match``): the pool's longest cached prefix, capped so the last prompt
  token is always computed, and what taking it leaves free;
- **allocation**: a request's table (``open``, ``grow``, ``free``), the blocks set aside at
  admission for a replay's private copies (``reserve``), and the blocks a store load fills
  or pins (``take_load_blocks``, ``pin_window``, ``release_job``);
- **replay privatization** (``start_replay``): the hit blocks a bounded replay writes into
  are swapped for copies of the request's own before anything reads them;
- **the hybrid pool** (``sliding``, ``engine.kv.sliding_tables``): a hybrid model's
  sliding groups keep pages only for the blocks a request's window still sees (``grow``);
- **what each block holds**: the layers a block's K/V covers and the layers the store is
  known to hold (``plan``, ``land``, ``layers_of``, ``mark_stored``), and which leading
  blocks of a table are indexed (``cache_computed``).

Changes of the prefix index are events (``events``, ``engine.kv.kv_events``). Everything
runs on the engine thread; requests are ``Sequence`` objects, whose ``key_memo`` this fills.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from bounded_replay import ReplayPlan
from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import KVBlock
from engine.kv.cache import KVCache
from engine.kv.kv_events import KVEventListeners
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.sliding_rows import index_computed, land_sliding_rows, row_pages
from engine.kv.sliding_tables import (
    NoSlidingTables,
    NullWindowListener,
    SlidingTables,
    WindowListener,
)
from kvstore.keys import Key, Namespace, chain_keys
from kvstore.tier import TierStats

if TYPE_CHECKING:
    from engine.core.sequence import Sequence as Request

Owner = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The pool's part of a request's hit, found at admission and not yet taken."""

    blocks: tuple[KVBlock, ...]  # the longest cached prefix, capped
    cap_blocks: int  # blocks the prompt may take from any cache (``hit_cap``)
    free_after: int  # free pool blocks once ``blocks`` are taken


@dataclass(frozen=True, slots=True)
class BlockLayers:
    """Per block of a finished request's table: the layers it holds, and of those the layers
    the store is known to hold."""

    held: tuple[frozenset[int], ...]
    stored: tuple[frozenset[int], ...]


def _owner(seq: Request) -> Owner:
    return ("seq", seq.seq_id)


def _reserve(seq: Request) -> Owner:
    """The blocks set aside at admission for the private copies a replay may need."""
    return ("reserve", seq.seq_id)


class KVManager:
    def __init__(
        self,
        cache: KVCache,
        planner: ReplayPlanner,
        ns: Namespace,
        *,
        cache_generated_tokens: bool = True,
        max_chunk_tokens: int = 0,
    ) -> None:
        """Tables over ``cache``'s blocks (whose rows a replay's private copies copy).
        ``ns``: the engine's primary namespace (the pool's keys). ``cache_generated_tokens``:
        whether an answer's full blocks are indexed and committed, or the prompt's only.
        ``max_chunk_tokens``: the most tokens one step computes for a request (a hybrid
        pool's sliding groups hold pages for them on top of the window)."""
        self.max_chunk_tokens = max_chunk_tokens
        shape = cache.shape
        self.layout = cache.layout
        self.events = KVEventListeners()
        # The pool's own listeners: the sliding tables (a full block's eviction detaches
        # its companion) before whoever registers with ``events``.
        pool_events = KVEventListeners()
        self.blocks = BlockManager(shape.num_blocks, shape.block_tokens,
                                   shape.bytes_per_page, pool_events)
        self.sliding: SlidingTables | NoSlidingTables = NoSlidingTables()
        if self.layout.is_hybrid:
            self.sliding = SlidingTables(self.blocks, self.layout.num_sliding_groups,
                                         planner.sliding_layers)
            pool_events.add(self.sliding)
        pool_events.add(self.events)
        # Told before a request's sliding rows leave its window (exact mode's store commits
        # them then); by default nobody.
        self.window_listener: WindowListener = NullWindowListener()
        self.planner = planner
        self.ns = ns
        self.cache = cache
        self.copy_blocks = cache.copy_blocks
        self.cache_generated_tokens = cache_generated_tokens
        self._job_ids = itertools.count()
        # Per running request (by seq_id): leading table blocks in the pool's index (or,
        # for the hit blocks a replay writes into, held as private copies) ...
        self._num_cached: dict[int, int] = {}
        # ... and the layers the store held for hit blocks swapped for private copies
        # (chain index -> layers): their keys are the originals', so commits skip them.
        self._copied_stored: dict[int, dict[int, frozenset[int]]] = {}

    # -- sizes ------------------------------------------------------------------------
    @property
    def block_tokens(self) -> int:
        return self.blocks.block_tokens

    @property
    def num_blocks(self) -> int:
        """Pages a request may take (a hybrid pool keeps one as the null block)."""
        return self.blocks.pool.num_blocks - (1 if self.layout.is_hybrid else 0)

    @property
    def num_free(self) -> int:
        """Free pages, counting those of cached companions nobody holds (evicted on
        demand)."""
        return self.blocks.num_free + self.sliding.reclaimable_pages

    def blocks_for(self, num_tokens: int) -> int:
        return self.blocks.blocks_for(num_tokens)

    @property
    def max_reserve_blocks(self) -> int:
        """The most pages an admission sets aside for a replay's private copies, and in a
        hybrid pool the most that one request's sliding groups hold (its window and a
        chunk): what one request may not fill with its full-attention blocks."""
        g = self.layout.num_sliding_groups
        window = (self.layout.window_tokens + self.max_chunk_tokens) // self.block_tokens + 2
        return self.planner.max_reserve_blocks + (g * window if g else 0)

    # -- keys -------------------------------------------------------------------------
    def keys(self, seq: Request, ns: Namespace | None = None) -> list[Key]:
        """Chain keys of every full block of ``seq``'s tokens so far (DESIGN §3), in ``ns``
        (default the pool's) as the request sees it (``seq.namespace``): the same keys the
        store uses, so one chain names a block in the pool and in the store, and requests
        of different scopes never share a block."""
        ns = seq.namespace(ns or self.ns)
        n = len(seq.token_ids) // ns.block_tokens
        keys = seq.key_memo.get(ns)
        if keys is None or len(keys) != n:
            # Rehashing from the root when a block fills costs microseconds per block; the
            # store's key API has no incremental form, and the chain must be its own.
            keys = seq.key_memo[ns] = chain_keys(ns, seq.token_ids[: n * ns.block_tokens])
        return keys

    # -- prefix match -----------------------------------------------------------------
    def match(self, seq: Request) -> PrefixMatch:
        """The pool's longest cached prefix of ``seq`` (no side effects; ``open`` takes it)."""
        cap = self.blocks.hit_cap(seq.num_tokens)
        hit = self.blocks.longest_prefix(self.keys(seq), seq.num_tokens)
        return PrefixMatch(tuple(hit), cap, self.free_after(hit))

    def free_after(self, hit: Sequence[KVBlock]) -> int:
        """Free blocks once ``hit`` is taken (a free cached block it revives is not free).
        In a hybrid pool a new block also takes a companion (one page per sliding group),
        and the window before it may too: the count is of blocks with their companions."""
        free = self.num_free - sum(1 for b in hit if b.ref_cnt == 0)
        if not self.layout.is_hybrid:
            return free
        g = self.layout.num_sliding_groups
        window = self.layout.window_tokens // self.block_tokens + 1
        return max(0, (free - g * window) // (1 + g))

    def has_sliding(self, blocks: Sequence[KVBlock]) -> list[bool]:
        """Per block, whether it holds the sliding layers (a loaded block may not)."""
        return [self.planner.has_sliding(b) for b in blocks]

    def plan(self, seq: Request, has_sliding: Sequence[bool]) -> ReplayPlan:
        """``seq``'s replay plan for a hit of ``len(has_sliding)`` blocks."""
        return self.planner.plan(seq.num_tokens, has_sliding)

    # -- a request's table ------------------------------------------------------------
    def open(self, seq: Request, hit: Sequence[KVBlock], *, lookup_blocks: int) -> None:
        """Start ``seq``'s table with the pool's ``hit`` (referenced here)."""
        self.blocks.open(_owner(seq), hit, lookup_blocks=lookup_blocks)

    def holds(self, seq: Request) -> bool:
        return self.blocks.holds(_owner(seq))

    def table(self, seq: Request) -> list[KVBlock]:
        return self.blocks.table(_owner(seq))

    def block_ids(self, seq: Request) -> list[int]:
        return self.blocks.block_ids(_owner(seq))

    def grow(self, seq: Request, num_tokens: int) -> bool:
        """Make ``seq``'s table cover ``num_tokens`` tokens, and in a hybrid pool give its
        sliding groups pages for exactly the blocks they can still see (the window before
        ``seq.num_computed_tokens`` and the chunk up to ``num_tokens``), giving back the
        rest. False when the pool lacks the pages (the scheduler preempts and retries)."""
        owner = _owner(seq)
        self.sliding.make_room(self.blocks_for(num_tokens) - len(self.blocks.table(owner)))
        if not self.blocks.grow(owner, num_tokens):
            return False
        a = seq.num_computed_tokens
        lo = self.layout.window_first_block(self.planner.kept_window_from(a),
                                            self.block_tokens)
        cacheable = self.cacheable_blocks(seq)
        leaving = sorted(i for i in self.sliding.held(seq.seq_id) if i < min(lo, cacheable))
        if leaving:
            self.window_listener.leaving(seq, leaving)
        return self.sliding.ensure(seq.seq_id, self.blocks.table(owner), lo,
                                   a // self.block_tokens, self.blocks_for(num_tokens))

    def row_pages(self, seq: Request, indices: Sequence[int]) -> dict[int, list[int]]:
        """Per KV group, the pages of ``seq``'s chain blocks ``indices`` (store copies)."""
        return row_pages(self.sliding, seq.seq_id, self.table(seq), indices)

    def reserve(self, seq: Request, n: int) -> None:
        """Set ``n`` free blocks aside for ``seq``'s replay copies (the caller checked)."""
        self.sliding.make_room(n)
        if self.blocks.take(_reserve(seq), n) is None:
            raise EngineIntegrityError("pool lost free blocks during admission")

    def free(self, seq: Request) -> None:
        """Drop everything ``seq`` holds: its table (tail first) and its reserve."""
        self.sliding.release(seq.seq_id)
        self.blocks.release(_owner(seq))
        self.blocks.release(_reserve(seq))
        self._num_cached.pop(seq.seq_id, None)
        self._copied_stored.pop(seq.seq_id, None)

    def num_cached_blocks(self, seq: Request) -> int:
        return self._num_cached.get(seq.seq_id, 0)

    # -- replay privatization ---------------------------------------------------------
    def start_replay(self, seq: Request, plan: ReplayPlan, pool_blocks: int) -> None:
        """Ready ``seq``'s table for its plan: its table holds the hit (the pool's
        ``pool_blocks`` first, then what the store filled) and maybe fresh blocks after
        it. Indexed blocks past a hit the plan shortened go back; the pool's hit blocks the
        replay writes into become private copies, in the room its reserve kept."""
        owner = _owner(seq)
        table = self.blocks.table(owner)
        h = plan.hit_blocks
        if len(table) > h and table[h].key is not None:
            self.blocks.truncate(owner, h)  # indexed blocks past the hit: not ours to write
        self.sliding.drop_from(seq.seq_id, plan.replay_blocks.start if plan.replay_blocks
                               else h)
        shared = range(plan.replay_blocks.start, min(plan.replay_blocks.stop, pool_blocks))
        self._copied_stored[seq.seq_id] = {i: table[i].stored_layers for i in shared}
        self.blocks.release(_reserve(seq))  # its blocks are the private copies' room
        if shared:
            self.copy_blocks(self.blocks.privatize(owner, shared.start, shared.stop))
        self._num_cached[seq.seq_id] = h

    # -- what the blocks hold ---------------------------------------------------------
    def cacheable_blocks(self, seq: Request) -> int:
        """Leading blocks of ``seq`` computed and allowed in the pool index and the store."""
        full = seq.num_computed_tokens // self.block_tokens
        if not self.cache_generated_tokens:
            full = min(full, seq.num_prompt_tokens // self.block_tokens)
        return full

    def cache_computed(self, seq: Request) -> None:
        """Index the blocks ``seq`` filled since the last call (every layer computed)."""
        full = self.cacheable_blocks(seq)
        done = self._num_cached.get(seq.seq_id, 0)
        if full <= done:
            return
        owner, keys = _owner(seq), self.keys(seq)
        if not self.layout.is_hybrid:
            self.blocks.cache(owner, keys, done, full, self.planner.computed_layers,
                              seq.token_ids)
        else:
            assert isinstance(self.sliding, SlidingTables)
            index_computed(self.blocks, self.sliding, self.planner, owner, seq.seq_id, keys,
                           done, full, seq.token_ids)
        self._num_cached[seq.seq_id] = full

    def layers_of(self, seq: Request, full: int) -> BlockLayers:
        """Per block of ``seq``'s first ``full``: an indexed block records both; the request
        computed every layer of the blocks past its hit; a private copy of a hit block
        holds the primary layers, stored as its original was."""
        hit = seq.plan.hit_blocks if seq.plan is not None else 0
        copied = self._copied_stored.get(seq.seq_id, {})
        sliding = self.sliding.held(seq.seq_id)
        none: frozenset[int] = frozenset()
        rewritten = self.planner.rewritten_blocks(seq.plan, seq.num_computed_tokens)
        held: list[frozenset[int]] = []
        stored: list[frozenset[int]] = []
        for i, b in enumerate(self.table(seq)[:full]):
            # A hit block the replay wrote whole holds its sliding rows (or its companion)
            extra = self.planner.sliding_layers if i in rewritten and (
                not self.layout.is_hybrid or i in sliding) else none
            if b.key is not None:
                held.append(b.layers | extra)
                stored.append(b.stored_layers)
            elif i >= hit:
                held.append(self.planner.computed_layers
                            if not self.layout.is_hybrid or i in sliding
                            else self.planner.primary_layers)
                stored.append(none)
            else:
                held.append(self.planner.primary_layers | extra)
                stored.append(copied.get(i, none))
        return BlockLayers(tuple(held), tuple(stored))

    def mark_stored(self, block_ids: Sequence[int], keys: Sequence[Key],
                    layers: frozenset[int]) -> None:
        """The store accepted ``layers`` of these blocks (their pool keys): mark those not
        reused since (same key, holding the layers) as stored, so they are not resent."""
        for block_id, key in zip(block_ids, keys, strict=True):
            block = self.blocks.pool.blocks[block_id]
            if block.key == key and layers <= block.layers:
                block.stored_layers |= layers

    # -- blocks of store loads --------------------------------------------------------
    def take_load_blocks(self, n: int) -> tuple[Owner, list[KVBlock]]:
        """A load job's own ``n`` fresh blocks (the caller checked the pool has them)."""
        owner = ("load", next(self._job_ids))
        self.sliding.make_room(n)
        taken = self.blocks.take(owner, n)
        if taken is None:
            raise EngineIntegrityError("pool lost free blocks during admission")
        return owner, taken

    def pin_window(self, hit: Sequence[KVBlock]) -> Owner | None:
        """Exact mode: hold the hit blocks whose sliding rows a load may write (those that
        lack them in the last window of any hit it can end with, at least the pool's), so
        they stay put whatever becomes of the request. None when there are none."""
        w0 = self.planner.window_first_block(len(hit))
        pinned = [b for b in hit[w0:] if not self.planner.has_sliding(b)]
        if not pinned:
            return None
        owner = ("load-pin", next(self._job_ids))
        self.blocks.hold(owner, pinned)
        return owner

    def release_job(self, owner: Owner | None) -> None:
        """Drop what a load job still holds (nothing once its blocks were handed over)."""
        if owner is not None:
            self.blocks.release(owner)

    def land(self, seq: Request, job_owner: Owner, keys: Sequence[Key], loaded: int,
             store_blocks: int, sliding_loaded: Sequence[int],
             sliding_rows: torch.Tensor | None = None) -> tuple[int, list[bool]]:
        """A load copied ``loaded`` blocks into ``job_owner``'s blocks (the chain ``keys``
        past ``seq``'s pool hit), the store holds the chain's first ``store_blocks``, and
        the sliding layers of the blocks ``sliding_loaded`` were copied in: hand the blocks
        to ``seq``, index them and record what they and the store hold. Returns the pool's
        hit in blocks and per block of the whole hit whether it holds the sliding layers."""
        planner = self.planner
        owner = _owner(seq)
        hit = len(self.blocks.table(owner))
        self.blocks.hand_over(job_owner, owner)
        self.blocks.cache(owner, keys, hit, hit + loaded, planner.primary_layers,
                          seq.token_ids)
        table = self.blocks.table(owner)
        for i in range(min(store_blocks, hit + loaded)):
            if table[i].key == keys[i]:
                table[i].stored_layers |= planner.primary_layers
        sliding = set(sliding_loaded)
        if isinstance(self.sliding, SlidingTables):  # the loader kept the rows
            sliding = land_sliding_rows(self.sliding, self.cache, planner, seq.seq_id, table,
                                        keys, sliding_loaded, sliding_rows)
        for i in sliding:  # copied in from the store: held and stored
            if table[i].key == keys[i]:
                table[i].layers |= planner.sliding_layers
                table[i].stored_layers |= planner.sliding_layers
        return hit, [planner.has_sliding(table[i]) or i in sliding
                     for i in range(hit + loaded)]

    # -- the pool as a tier -----------------------------------------------------------
    def stats(self) -> TierStats:
        return self.blocks.stats()

    def check_integrity(self) -> None:
        """The pool and its tables agree; per-request records belong to held tables."""
        self.blocks.check_integrity()
        self.sliding.check_integrity()
        for seq_id in (*self._num_cached, *self._copied_stored):
            if not self.blocks.holds(("seq", seq_id)):
                raise EngineIntegrityError(f"records of request {seq_id}, which holds "
                                           "no blocks")
