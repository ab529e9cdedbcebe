"""Block tables over the pool: who holds which blocks, and the pool seen as tier ``hbm``.

An *owner* is anything that holds pool blocks: a sequence (its block table, in token
order) or an in-flight load from the store (the blocks it is filling, and in exact mode
the hit blocks whose sliding rows it completes). Commits hold none: their bytes are copied
out when the request finishes. Every reference a block carries belongs to exactly one
owner's list, which is what ``check_integrity`` re-derives. All methods run on the engine
thread; background copies only ever touch blocks their owner holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from engine.errors import EngineIntegrityError
from engine.kv.block_pool import BlockPool, KVBlock
from engine.kv.kv_events import KVEventListener
from kvstore.keys import Key
from kvstore.tier import SizeClassStats, TierStats

Owner = Hashable


class BlockManager:
    def __init__(self, num_blocks: int, block_tokens: int, bytes_per_block: int,
                 events: KVEventListener | None = None) -> None:
        self.pool = BlockPool(num_blocks, events)
        self.block_tokens = block_tokens
        self.bytes_per_block = bytes_per_block
        self._tables: dict[Owner, list[KVBlock]] = {}
        self.counters: Counter[str] = Counter()

    # -- sizes ------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def hit_cap(self, num_tokens: int) -> int:
        """Blocks a prompt may take from a cache: a full hit still computes the last token,
        because its logits are what the first new token is sampled from."""
        return max(0, (num_tokens - 1) // self.block_tokens)

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    # -- prefix hits ------------------------------------------------------------------
    def longest_prefix(self, keys: Sequence[Key], num_tokens: int) -> list[KVBlock]:
        """Pool blocks of the longest cached prefix of a ``num_tokens`` prompt, capped by
        ``hit_cap``. No side effects; ``open`` takes them."""
        return self.pool.longest_prefix(keys[: self.hit_cap(num_tokens)])

    def open(self, owner: Owner, hit: Sequence[KVBlock], *, lookup_blocks: int = 0) -> None:
        """Start ``owner``'s table with the prefix ``hit`` (referenced here)."""
        if owner in self._tables:
            raise EngineIntegrityError(f"owner {owner!r} already holds blocks")
        self.pool.touch(hit)
        self._tables[owner] = list(hit)
        self.counters["lookups_total"] += 1
        self.counters["lookup_blocks_total"] += lookup_blocks
        self.counters["hit_blocks_total"] += len(hit)

    def holds(self, owner: Owner) -> bool:
        return owner in self._tables

    def table(self, owner: Owner) -> list[KVBlock]:
        return self._tables[owner]

    def block_ids(self, owner: Owner) -> list[int]:
        return [b.block_id for b in self._tables[owner]]

    # -- allocation -------------------------------------------------------------------
    def grow(self, owner: Owner, num_tokens: int) -> bool:
        """Make ``owner``'s table cover ``num_tokens`` tokens. All or nothing: False (and
        nothing allocated) when the pool lacks the blocks."""
        table = self._tables[owner]
        need = self.blocks_for(num_tokens) - len(table)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        table.extend(self.pool.allocate(need))
        return True

    def take(self, owner: Owner, n: int) -> list[KVBlock] | None:
        """A new owner holding ``n`` fresh blocks, or None if the pool lacks them."""
        if n > self.pool.num_free:
            return None
        self.open(owner, [])
        self.counters["lookups_total"] -= 1  # not a lookup: undo open()'s count
        self._tables[owner].extend(self.pool.allocate(n))
        return self._tables[owner]

    def hold(self, owner: Owner, blocks: Sequence[KVBlock]) -> None:
        """A new owner taking one more reference on blocks someone else holds (a load
        that writes into them: the blocks stay put until ``release``)."""
        if owner in self._tables:
            raise EngineIntegrityError(f"owner {owner!r} already holds blocks")
        self.pool.touch(blocks)
        self._tables[owner] = list(blocks)

    def hand_over(self, src: Owner, dst: Owner) -> None:
        """Append ``src``'s blocks to ``dst``'s table (their references move with them)."""
        blocks = self._tables.pop(src)
        self._tables[dst].extend(blocks)

    def cache(self, owner: Owner, keys: Sequence[Key], start: int, end: int,
              layers: frozenset[int], token_ids: Sequence[int]) -> None:
        """Index blocks ``[start, end)`` of ``owner``'s table (full, holding the K/V of
        ``layers``) under their chain keys, so later requests hit them. ``token_ids``: the
        owner's tokens from token 0 (at least ``end`` blocks' worth), for the pool's event
        listeners."""
        table = self._tables[owner]
        bt = self.block_tokens
        if len(token_ids) < end * bt:
            raise EngineIntegrityError(f"caching {end} blocks of {len(token_ids)} tokens")
        for i in range(start, end):
            self.pool.cache(table[i], keys[i], layers, parent=keys[i - 1] if i else None,
                            token_ids=token_ids[i * bt:(i + 1) * bt])

    def privatize(self, owner: Owner, start: int, end: int) -> list[tuple[int, int]]:
        """Give ``owner`` blocks of its own for table entries ``[start, end)``: each is
        replaced by a fresh block (its reference on the old one dropped). Returns the
        ``(old, new)`` block ids whose bytes the caller copies before anything reads the new
        ones. The pool must have the free blocks (the caller reserved them)."""
        table = self._tables[owner]
        if end - start > self.pool.num_free:
            raise EngineIntegrityError(f"privatize needs {end - start} free blocks, the pool "
                                       f"has {self.pool.num_free}")
        fresh = self.pool.allocate(end - start)
        old = table[start:end]
        table[start:end] = fresh
        self.pool.free(reversed(old))
        self.counters["private_copies_total"] += len(fresh)
        return [(a.block_id, b.block_id) for a, b in zip(old, fresh, strict=True)]

    def truncate(self, owner: Owner, num_blocks: int) -> None:
        """Drop ``owner``'s table entries from ``num_blocks`` on (tail first)."""
        table = self._tables[owner]
        tail = table[num_blocks:]
        del table[num_blocks:]
        self.pool.free(reversed(tail))

    def release(self, owner: Owner) -> None:
        """Drop all of ``owner``'s references, tail first (see ``BlockPool.free``)."""
        blocks = self._tables.pop(owner, None)
        if blocks:
            self.pool.free(reversed(blocks))

    # -- tier view --------------------------------------------------------------------
    def stats(self) -> TierStats:
        bb = self.bytes_per_block
        n = self.pool.num_blocks
        used = n - self.pool.num_empty  # in use, or free but still holding a cached block
        counters = dict(self.counters)
        counters.update(self.pool.counters)
        counters["blocks_in_use"] = n - self.pool.num_free
        counters["blocks_cached"] = self.pool.num_cached
        return TierStats(
            name="hbm",
            capacity_bytes=n * bb,
            used_bytes=used * bb,
            size_classes=(SizeClassStats(block_bytes=bb, capacity_blocks=n, used_blocks=used),),
            counters=counters,
        )

    def check_integrity(self) -> None:
        """The pool is consistent and each block's ref count equals the number of owners
        listing it; no owner lists a block twice."""
        self.pool.check_integrity()
        refs: Counter[int] = Counter()
        for owner, table in self._tables.items():
            ids = [b.block_id for b in table]
            if len(set(ids)) != len(ids):
                raise EngineIntegrityError(f"owner {owner!r} lists a block twice: {ids}")
            refs.update(ids)
        for block in self.pool.blocks:
            if block.ref_cnt != refs[block.block_id]:
                raise EngineIntegrityError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                    f"{refs[block.block_id]} owners hold it"
                )
