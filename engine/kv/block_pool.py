"""The pool's blocks: ref counts, the prefix index and the free queue (the bookkeeping of
the HBM tier, in the manner of vLLM v1's ``BlockPool``).

Every block is in exactly one of three states:

- **in use**: ``ref_cnt > 0``, held by sequences' block tables and by in-flight loads
  from the store (the blocks a load fills, and in exact mode the hit blocks whose sliding
  rows it completes). A commit copies its blocks out on the engine thread when the
  request finishes, so it holds none;
- **free, cached**: ``ref_cnt == 0`` with a chain key; listed in the prefix index and in the
  LRU free queue, so a later request can still hit it until it is evicted;
- **free, empty**: ``ref_cnt == 0`` and no key.

An indexed block records the layers whose K/V it holds: every layer when this engine
computed it, only the stored layers when it was loaded from the store (the full-attention
layers, and the sliding layers only for the last window's blocks, which bounded mode's
store has only at a window tail). A pool hit on a block without the sliding layers is
therefore still replayed or completed from the store, never read as if it held them.

Allocation takes empty blocks first, then evicts the least recently freed cached block.
Sequences free their blocks tail first, so the tail of a chain is evicted first and what
stays cached of a chain is always a prefix, as in the store's tiers (DESIGN §6).

Every change of the index is reported to ``events`` (``engine.kv.kv_events``): a block
indexed (stored), a block evicted (removed), the index reset (all cleared).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.errors import EngineIntegrityError
from engine.kv.kv_events import KVEventListener, NullKVEventListener
from kvstore.keys import Key


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    key: Key | None = None  # the chain key (DESIGN §3) once full and indexed
    # The layers whose K/V this block holds, set when it is indexed.
    layers: frozenset[int] = frozenset()
    # The layers the store is known to hold under this block's key (loaded from it, or
    # committed and accepted): a finished request does not send them again.
    stored_layers: frozenset[int] = frozenset()


class NoFreeBlocks(Exception):
    """Raised by ``allocate`` when fewer blocks are free than asked for (nothing taken)."""


class BlockPool:
    def __init__(self, num_blocks: int,
                 events: KVEventListener | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Reversed so that pop() hands out block 0 first: easier to read in tests and dumps.
        self._empty: list[KVBlock] = list(reversed(self.blocks))
        self._cached_free: OrderedDict[int, KVBlock] = OrderedDict()  # LRU first
        self._index: dict[Key, KVBlock] = {}
        self.counters: Counter[str] = Counter()
        self.events = events if events is not None else NullKVEventListener()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._empty) + len(self._cached_free)

    @property
    def num_empty(self) -> int:
        return len(self._empty)

    @property
    def num_cached(self) -> int:
        return len(self._index)

    # -- the prefix index -------------------------------------------------------------
    def longest_prefix(self, keys: Sequence[Key]) -> list[KVBlock]:
        """Blocks holding the longest indexed prefix of ``keys``. No side effects: the caller
        takes them with ``touch`` in the same step."""
        hit: list[KVBlock] = []
        for key in keys:
            block = self._index.get(key)
            if block is None:
                break
            hit.append(block)
        return hit

    def cache(self, block: KVBlock, key: Key, layers: frozenset[int], *,
              parent: Key | None, token_ids: Sequence[int]) -> bool:
        """Index a full, in-use block holding the K/V of ``layers`` under its chain key. A
        key already indexed (another sequence computed or loaded the same block meanwhile)
        keeps its block; this one stays unindexed and goes back empty when freed. Returns
        whether it was indexed. ``parent`` (the chain key of the block before it, None for
        a chain's first) and ``token_ids`` (this block's own tokens) are for the event
        listeners only: the pool keeps neither."""
        if block.ref_cnt < 1:
            raise EngineIntegrityError(f"block {block.block_id} cached while free")
        if not layers:
            raise EngineIntegrityError(f"block {block.block_id} indexed holding no layer")
        if block.key is not None:
            return block.key == key
        if key in self._index:
            self.counters["duplicate_blocks_total"] += 1
            return False
        block.key = key
        block.layers = layers
        self._index[key] = block
        self.counters["cached_blocks_total"] += 1
        self.events.block_stored(block.block_id, key, layers, parent, token_ids)
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (a new model or a test's clean slate). Only while no
        block is in use, as vLLM's: a held block's key is still its owner's. Returns
        whether the index was reset."""
        if self.num_free != self.num_blocks:
            return False
        for block in self._cached_free.values():
            block.key = None
            block.layers = block.stored_layers = frozenset()
            self._empty.append(block)
        self._cached_free.clear()
        self._index.clear()
        self.counters["prefix_cache_resets_total"] += 1
        self.events.all_cleared()
        return True

    # -- references -------------------------------------------------------------------
    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each block, reviving free cached ones."""
        for block in blocks:
            if block.ref_cnt == 0:
                if block.key is None:
                    raise EngineIntegrityError(f"touched free empty block {block.block_id}")
                del self._cached_free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[KVBlock]:
        """``n`` blocks with one reference each; evicts LRU cached blocks if needed."""
        if n > self.num_free:
            raise NoFreeBlocks(f"{n} blocks asked, {self.num_free} free")
        out: list[KVBlock] = []
        for _ in range(n):
            if self._empty:
                block = self._empty.pop()
            else:
                _, block = self._cached_free.popitem(last=False)
                assert block.key is not None  # only keyed blocks enter the cached queue
                del self._index[block.key]
                self.events.block_removed(block.block_id, block.key)
                block.key = None
                block.layers = block.stored_layers = frozenset()
                self.counters["evicted_blocks_total"] += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block, in the order given: pass a chain tail first,
        so that its tail becomes the least recently used."""
        for block in blocks:
            if block.ref_cnt < 1:
                raise EngineIntegrityError(f"block {block.block_id} freed twice")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.key is None:
                    self._empty.append(block)
                else:
                    self._cached_free[block.block_id] = block

    def check_integrity(self) -> None:
        """Every block in exactly one state; index and keys agree."""
        def fail(msg: str) -> EngineIntegrityError:
            return EngineIntegrityError(f"block pool: {msg}")

        empty_ids = [b.block_id for b in self._empty]
        if len(set(empty_ids)) != len(empty_ids):
            raise fail("a block is listed twice as empty")
        free_ids = set(empty_ids) | set(self._cached_free)
        if len(free_ids) != self.num_free:
            raise fail("a block is both empty and cached-free")
        for block in self.blocks:
            free = block.block_id in free_ids
            if free != (block.ref_cnt == 0):
                raise fail(f"block {block.block_id} ref_cnt {block.ref_cnt}, free={free}")
            if block.ref_cnt < 0:
                raise fail(f"block {block.block_id} has ref_cnt {block.ref_cnt}")
            if block.key is not None and self._index.get(block.key) is not block:
                raise fail(f"block {block.block_id} holds a key the index maps elsewhere")
        for block_id, block in self._cached_free.items():
            if block.block_id != block_id or block.key is None:
                raise fail(f"cached-free block {block_id} has no key")
        for block in self._empty:
            if block.key is not None:
                raise fail(f"empty block {block.block_id} still holds a key")
        for block in self.blocks:
            if block.key is None and (block.layers or block.stored_layers):
                raise fail(f"block {block.block_id} records layers without a key")
            if not block.stored_layers <= block.layers:
                raise fail(f"block {block.block_id}: the store holds layers the block lacks")
            if block.key is not None and not block.layers:
                raise fail(f"block {block.block_id} indexed holding no layer")
        for key, block in self._index.items():
            if block.key != key:
                raise fail(f"index entry points at block {block.block_id} of another key")
