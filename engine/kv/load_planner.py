"""What a request loads from the store, and what its table holds once the load landed.

At admission, a request whose pool hit falls short of its cacheable prefix (or, in exact
mode for a hybrid model, whose last window lacks the sliding layers) gets a ``LoadJob``
for the background loader (``engine.kv.loader``): the chain's keys up to the hit cap, the
pool blocks the store's part lands in, the deadline after which the request recomputes
instead, and in exact mode the sliding namespace's keys and which pool hit blocks already
hold those layers. When the loader is done, the blocks it actually copied are handed to
the request, indexed in the pool, and marked as held by the store (the primary layers up
to what the store's look-up found; the sliding layers where they were copied in).

It stands apart from the scheduler (``engine.scheduler``), which decides when a request is
admitted and what runs: this decides what the store is asked for and what a finished
load means for the pool's blocks, as ``engine.kv.commit_planner`` does for commits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import KVBlock
from engine.kv.loader import LoadJob
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.store_link import StoreLink
from engine.sequence import Sequence
from kvstore.keys import Key


class LoadPlanner:
    """Loads over ``links`` (the primary first, then the sliding layers' in exact mode);
    ``load_timeout_s``: how long a request waits for its load before it recomputes.
    ``job_ids`` numbers the block manager owners of the jobs (shared with the commits)."""

    def __init__(
        self,
        blocks: BlockManager,
        links: tuple[StoreLink, ...],
        planner: ReplayPlanner,
        load_timeout_s: float,
        job_ids: Iterator[int],
    ) -> None:
        self.blocks = blocks
        self.links = links
        self.planner = planner
        self.load_timeout_s = load_timeout_s
        self._job_ids = job_ids

    def start(
        self,
        seq: Sequence,
        owner: tuple[str, int],
        reserve_owner: tuple[str, int],
        keys: list[Key],
        cap: int,
        hit: list[KVBlock],
        reserve: int,
    ) -> LoadJob:
        """Open ``owner``'s table on the pool's ``hit``, take the blocks the store's part
        of the chain ``keys`` up to the hit cap ``cap`` lands in (held by the job) and
        ``reserve`` blocks for a replay's private copies (held by ``reserve_owner``), and
        describe the load. The caller checked that the pool has the free blocks."""
        self.blocks.open(owner, hit, lookup_blocks=cap)
        job_owner = ("load", next(self._job_ids))
        taken = self.blocks.take(job_owner, cap - len(hit))
        if taken is None or self.blocks.take(reserve_owner, reserve) is None:
            raise EngineIntegrityError("pool lost free blocks during admission")
        job = LoadJob(
            owner=job_owner,
            seq_id=seq.seq_id,
            keys=keys[:cap],
            first_block=len(hit),
            block_ids=[b.block_id for b in taken],
            deadline_s=time.monotonic() + self.load_timeout_s,
            scope=seq.scope,
        )
        planner = self.planner
        if planner.loads_sliding and len(self.links) > 1:
            job.sliding_keys = seq.block_keys(self.links[1].ns)[:cap]
            job.pool_block_ids = [b.block_id for b in hit]
            job.pool_has_sliding = [planner.has_sliding(b) for b in hit]
            # The hit blocks whose sliding rows the loader may write: those lacking them
            # in the last window of any hit it can end with (at least the pool's).
            w0 = planner.window_first_block(len(hit))
            pinned = [b for b in hit[w0:] if not planner.has_sliding(b)]
            if pinned:
                job.pin_owner = ("load-pin", next(self._job_ids))
                self.blocks.hold(job.pin_owner, pinned)
        return job

    def release(self, job: LoadJob) -> None:
        """The loader is done with ``job``: drop the references it still holds (its blocks
        when they were not handed to the request, and the hit blocks it pinned)."""
        self.blocks.release(job.owner)
        if job.pin_owner is not None:
            self.blocks.release(job.pin_owner)

    def land(self, owner: tuple[str, int], job: LoadJob,
             token_ids: list[int]) -> tuple[int, list[bool]]:
        """Hand ``job``'s copied blocks to ``owner`` (whose table holds the pool's hit) and
        index them; returns the pool's hit in blocks, and per block of the hit with the
        store's part whether it holds the sliding layers (what the replay plan needs)."""
        planner = self.planner
        hit = len(self.blocks.table(owner))
        got = job.loaded_blocks
        self.blocks.hand_over(job.owner, owner)
        self.blocks.cache(owner, job.keys, hit, hit + got, planner.primary_layers, token_ids)
        table = self.blocks.table(owner)
        for i in range(min(job.store_blocks, hit + got)):
            if table[i].key == job.keys[i]:
                table[i].stored_layers |= planner.primary_layers
        sliding = set(job.sliding_loaded)
        for i in sliding:  # copied in from the store: held and stored
            if table[i].key == job.keys[i]:
                table[i].layers |= planner.sliding_layers
                table[i].stored_layers |= planner.sliding_layers
        return hit, [planner.has_sliding(table[i]) or i in sliding for i in range(hit + got)]
