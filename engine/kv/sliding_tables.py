"""The sliding groups' pages: per request, only the blocks a sliding layer can still see.

For a hybrid layout (``engine.kv.kv_groups``) every block of tokens a request holds has a
full-attention page (its entry in the request's block table, ``engine.kv.block_manager``)
and, while a sliding layer can still attend to it, a *companion*: one page per sliding
group holding those layers' K/V of the block. A request keeps companions for the blocks
from the first one its next query can see (``KVGroupLayout.window_first_block``) to the end
of the chunk being computed; ``trim`` gives back the rest. Its sliding block tables name
the shared ``null_page`` (zeros, never written) where it holds none: the kernels mask those
keys (outside the window, or before a replay's ``kv_start``), and the null page keeps even a
masked read finite.

A companion is **attached** to the full block whose sliding rows it holds once that block
is indexed: a later request hitting the block takes a reference on it instead of
recomputing the window (the pool's ``has_sliding``). An attached companion no request
holds any more (it left every window, or its request ended) stays cached in an LRU queue
but only in pages nobody else wants: ``make_room`` evicts it before the pool evicts any
cached full block, and eviction strips the sliding layers from its block's record, so a
later hit replays or reloads them. Unattached companions go back at once. A full block the
pool evicts (``block_removed``) detaches its companion.

Pages come from the block pool itself (each companion is one owner of the block manager),
so full blocks and companions compete for one budget, as in vLLM v1's hybrid manager.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import KVBlock
from engine.kv.kv_events import NullKVEventListener


@dataclass(eq=False, slots=True)
class Companion:
    cid: int
    pages: tuple[int, ...]  # one page per sliding group
    refs: int = 0  # requests (and loads) holding it
    attached: KVBlock | None = None  # the indexed full block whose sliding rows it holds


class WindowListener(ABC):
    """Told, on the engine thread, before a request gives back the sliding rows of blocks
    that left its window: the last moment they can be read (exact mode's commits stage
    them for the store here). It must copy what it needs before it returns."""

    @abstractmethod
    def leaving(self, seq: Any, indices: list[int]) -> None:
        """Chain blocks ``indices`` of request ``seq`` (computed, cacheable) lose their
        sliding rows once this returns."""


class NullWindowListener(WindowListener):
    """The default: nobody needs the rows (no store, or bounded mode stores no sliding
    layer)."""

    def leaving(self, seq: Any, indices: list[int]) -> None:
        pass


class SlidingTables(NullKVEventListener):
    def __init__(self, blocks: BlockManager, num_groups: int,
                 sliding_layers: frozenset[int]) -> None:
        self.blocks = blocks
        self.num_groups = num_groups
        self.sliding_layers = sliding_layers
        self._ids = itertools.count()
        self._tables: dict[int, dict[int, Companion]] = {}  # seq_id -> chain index -> c
        self._of_block: dict[int, Companion] = {}  # full block id -> attached companion
        self._idle: OrderedDict[int, Companion] = OrderedDict()  # attached, unreferenced
        self._orphans: list[Companion] = []  # detached by an eviction, freed at next call
        null = blocks.take(("null-page",), 1)
        if null is None:
            raise EngineIntegrityError("a hybrid pool needs a page for the null block")
        self.null_page = null[0].block_id

    # -- budget -----------------------------------------------------------------------
    @property
    def reclaimable_pages(self) -> int:
        """Pages held by companions nobody references (evicted on demand)."""
        return self.num_groups * (len(self._idle) + len(self._orphans))

    def _owner(self, c: Companion) -> tuple[str, int]:
        return ("sliding", c.cid)

    def _new(self) -> Companion | None:
        self.make_room(self.num_groups)
        c = Companion(next(self._ids), ())
        got = self.blocks.take(self._owner(c), self.num_groups)
        if got is None:
            return None
        c.pages = tuple(b.block_id for b in got)
        return c

    def _unref(self, c: Companion) -> None:
        """Drop a reference; an attached companion nobody holds stays cached (a later hit
        whose window ends at its block needs it), any other goes back at once."""
        c.refs -= 1
        if c.refs > 0:
            return
        if c.attached is not None:
            self._idle[c.cid] = c
        else:
            self.blocks.release(self._owner(c))

    def _ref(self, c: Companion) -> None:
        if c.refs == 0:
            self._idle.pop(c.cid, None)
        c.refs += 1

    def _evict(self, c: Companion) -> None:
        block = c.attached
        if block is not None:
            self._detach(block)
        self.blocks.counters["sliding_evictions_total"] += 1

    def _detach(self, block: KVBlock) -> None:
        c = self._of_block.pop(block.block_id)
        c.attached = None
        block.layers -= self.sliding_layers
        block.stored_layers -= self.sliding_layers
        if c.refs == 0:
            self._idle.pop(c.cid, None)
            self._orphans.append(c)

    def _reap(self) -> None:
        while self._orphans:
            self.blocks.release(self._owner(self._orphans.pop()))

    # -- the pool's events: a full block left the index --------------------------------
    def block_removed(self, block_id: int, key: object) -> None:
        # Called inside the pool's bookkeeping: only records; pages go back at _reap.
        if block_id in self._of_block:
            self._detach(self.blocks.pool.blocks[block_id])

    def all_cleared(self) -> None:
        for block_id in list(self._of_block):
            self._detach(self.blocks.pool.blocks[block_id])

    def make_room(self, pages: int) -> None:
        """Evict unreferenced companions (LRU) until ``pages`` pages are empty or none is
        left: before the pool evicts any cached full block, since a full block serves a
        hit of its chain in every mode (bounded replay, or a store that holds the window)
        while a companion only spares exact mode the window's sliding rows."""
        self._reap()
        while self.blocks.pool.num_empty < pages and self._idle:
            self._evict(self._idle.popitem(last=False)[1])
            self._reap()

    def drop_idle(self) -> None:
        """Evict every unreferenced companion (before a prefix-cache reset)."""
        while self._idle:
            self._evict(self._idle.popitem(last=False)[1])
        self._reap()

    # -- a request's companions --------------------------------------------------------
    def held(self, seq_id: int) -> dict[int, Companion]:
        return self._tables.get(seq_id, {})

    def ensure(self, seq_id: int, table: Sequence[KVBlock], lo: int, write_from: int,
               hi: int) -> bool:
        """Give ``seq_id`` companions for chain blocks ``[lo, hi)`` of its ``table``: blocks
        from ``write_from`` on get pages of its own (it writes them), earlier ones the
        companion attached to their full block if any (read only), else none. Companions
        below ``lo`` go back. False when the pages ran out (what was taken stays held)."""
        self.trim(seq_id, lo)
        mine = self._tables.setdefault(seq_id, {})
        for i in range(lo, hi):
            if i in mine:
                continue
            if i < write_from:
                c = self._of_block.get(table[i].block_id)
                if c is None:
                    continue
                self._ref(c)
            else:
                new = self._new()
                if new is None:
                    return False
                c = new
                c.refs = 1
            mine[i] = c
        self._reap()
        return True

    def trim(self, seq_id: int, lo: int) -> None:
        """Give back ``seq_id``'s companions of chain blocks below ``lo``."""
        mine = self._tables.get(seq_id)
        if not mine:
            return
        for i in [i for i in mine if i < lo]:
            self._unref(mine.pop(i))
        self._reap()

    def drop_from(self, seq_id: int, start: int) -> None:
        """Give back ``seq_id``'s companions of chain blocks from ``start`` on."""
        mine = self._tables.get(seq_id, {})
        for i in [i for i in mine if i >= start]:
            self._unref(mine.pop(i))
        self._reap()

    def release(self, seq_id: int) -> None:
        for c in self._tables.pop(seq_id, {}).values():
            self._unref(c)
        self._reap()

    def attach(self, seq_id: int, index: int, block: KVBlock) -> bool:
        """``block`` (chain block ``index`` of ``seq_id``, just indexed) keeps the request's
        companion as its sliding rows. False when the request holds none for it."""
        c = self.held(seq_id).get(index)
        if c is None or block.block_id in self._of_block:
            return False
        if c.attached is not None:
            return c.attached is block
        c.attached = block
        self._of_block[block.block_id] = c
        return True

    def has_rows(self, block: KVBlock) -> bool:
        return block.block_id in self._of_block

    def adopt(self, seq_id: int, index: int, block: KVBlock) -> Companion | None:
        """A fresh companion for chain block ``index`` (``block``, indexed) of ``seq_id``,
        attached to it: where a store load's sliding rows land. None when pages ran out
        or the block has one already."""
        if block.block_id in self._of_block or index in self.held(seq_id):
            return None
        c = self._new()
        if c is None:
            return None
        c.refs = 1
        self._tables.setdefault(seq_id, {})[index] = c
        c.attached = block
        self._of_block[block.block_id] = c
        return c

    def companion(self, seq_id: int, index: int, block: KVBlock) -> Companion:
        """The companion holding chain block ``index``'s sliding rows for ``seq_id``: its
        own, else the one attached to ``block``."""
        c = self.held(seq_id).get(index) or self._of_block.get(block.block_id)
        if c is None:
            raise EngineIntegrityError(f"chain block {index} has no sliding rows")
        return c

    def pages_of(self, seq_id: int, indices: Iterable[int]) -> list[tuple[int, ...]]:
        """Per chain index, the sliding groups' pages the request reads (null if none)."""
        mine = self.held(seq_id)
        null = (self.null_page,) * self.num_groups
        return [mine[i].pages if i in mine else null for i in indices]

    # -- checks -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """References match the tables; idle companions are exactly the attached ones
        nobody holds; an attached companion's block records the sliding layers only if
        indexed; every companion's pages are its block-manager owner's."""
        refs: dict[int, int] = {}
        live: dict[int, Companion] = {}
        for mine in self._tables.values():
            for c in mine.values():
                refs[c.cid] = refs.get(c.cid, 0) + 1
                live[c.cid] = c
        for c in (*self._idle.values(), *self._of_block.values()):
            live[c.cid] = c
        for c in live.values():
            if c.refs != refs.get(c.cid, 0):
                raise EngineIntegrityError(f"companion {c.cid}: refs {c.refs}, held by "
                                           f"{refs.get(c.cid, 0)}")
            if (c.refs == 0) != (c.cid in self._idle):
                raise EngineIntegrityError(f"companion {c.cid} idle={c.cid in self._idle} "
                                           f"with {c.refs} references")
            if c.attached is not None and self._of_block.get(c.attached.block_id) is not c:
                raise EngineIntegrityError(f"companion {c.cid} attached to a block that "
                                           "names another")
            if self.blocks.block_ids(self._owner(c)) != list(c.pages):
                raise EngineIntegrityError(f"companion {c.cid} pages not its own")
        for block_id, c in self._of_block.items():
            if c.attached is None or c.attached.block_id != block_id:
                raise EngineIntegrityError(f"block {block_id} names a detached companion")
            if c.attached.key is None:
                raise EngineIntegrityError(f"companion {c.cid} attached to an unindexed "
                                           f"block {block_id}")
        for block in self.blocks.pool.blocks:
            if self.sliding_layers <= block.layers and block.block_id not in self._of_block:
                raise EngineIntegrityError(f"block {block.block_id} records sliding layers "
                                           "it has no companion for")


class NoSlidingTables:
    """The null object for a one-group pool: no companions, nothing to trim."""

    def has_rows(self, block: KVBlock) -> bool:
        return False

    def pages_of(self, seq_id: int, indices: Iterable[int]) -> list[tuple[int, ...]]:
        return []

    def adopt(self, seq_id: int, index: int, block: KVBlock) -> Companion | None:
        return None

    def companion(self, seq_id: int, index: int, block: KVBlock) -> Companion:
        raise EngineIntegrityError("a one-group pool has no companions")

    reclaimable_pages = 0
    num_groups = 0

    def ensure(self, seq_id: int, table: Sequence[KVBlock], lo: int, write_from: int,
               hi: int) -> bool:
        return True

    def trim(self, seq_id: int, lo: int) -> None:
        pass

    def drop_from(self, seq_id: int, start: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass

    def attach(self, seq_id: int, index: int, block: KVBlock) -> bool:
        return False

    def held(self, seq_id: int) -> dict[int, Companion]:
        return {}

    def make_room(self, pages: int) -> None:
        pass

    def drop_idle(self) -> None:
        pass

    def check_integrity(self) -> None:
        pass
