"""What a request loads from the store, and what its table holds once the load landed.

At admission, a request whose pool hit falls short of its cacheable prefix (or, in exact
mode for a hybrid model, whose last window lacks the sliding layers) gets a ``LoadJob``
for the background loader (``engine.connector.loader``): the chain's keys up to the hit cap, the
pool blocks the store's part lands in, the deadline after which the request recomputes
instead, and in exact mode the sliding namespace's keys and which pool hit blocks already
hold those layers. When the loader is done, the blocks it actually copied are handed to
the request, indexed in the pool, and marked as held by the store (the primary layers up
to what the store's look-up found; the sliding layers where they were copied in).

It is the store connector's (``engine.connector.store_connector``): the scheduler decides
when a request is admitted, this what the store is asked for; what a landed load means for
the pool's blocks is the KV manager's (``engine.kv.kv_manager``).
"""

from __future__ import annotations

import time

from engine.connector.loader import LoadJob
from engine.connector.store_link import StoreLink
from engine.core.sequence import Sequence
from engine.kv.kv_manager import KVManager, PrefixMatch


class LoadPlanner:
    """Loads over ``links`` (the primary first, then the sliding layers' in exact mode);
    ``load_timeout_s``: how long a request waits for its load before it recomputes."""

    def __init__(self, kv: KVManager, links: tuple[StoreLink, ...],
                 load_timeout_s: float) -> None:
        self.kv = kv
        self.links = links
        self.load_timeout_s = load_timeout_s

    def start(self, seq: Sequence, hit: PrefixMatch, reserve: int) -> LoadJob:
        """Open ``seq``'s table on the pool's ``hit``, take the blocks the store's part of
        its chain up to the hit cap lands in (held by the job) and ``reserve`` blocks for
        a replay's private copies, and describe the load. The caller checked that the pool
        has the free blocks."""
        kv, cap = self.kv, hit.cap_blocks
        kv.open(seq, hit.blocks, lookup_blocks=cap)
        job_owner, taken = kv.take_load_blocks(cap - len(hit.blocks))
        kv.reserve(seq, reserve)
        job = LoadJob(
            owner=job_owner,
            seq_id=seq.seq_id,
            keys=kv.keys(seq)[:cap],
            first_block=len(hit.blocks),
            block_ids=[b.block_id for b in taken],
            deadline_s=time.monotonic() + self.load_timeout_s,
            scope=seq.scope,
        )
        if kv.planner.loads_sliding and len(self.links) > 1:
            job.sliding_keys = kv.keys(seq, self.links[1].ns)[:cap]
            job.pool_block_ids = [b.block_id for b in hit.blocks]
            job.pool_has_sliding = kv.has_sliding(hit.blocks)
            job.pin_owner = kv.pin_window(hit.blocks)
        return job

    def release(self, job: LoadJob) -> None:
        """The loader is done with ``job``: drop the references it still holds (its blocks
        when they were not handed to the request, and the hit blocks it pinned)."""
        self.kv.release_job(job.owner)
        self.kv.release_job(job.pin_owner)

    def land(self, seq: Sequence, job: LoadJob) -> tuple[int, list[bool]]:
        """Hand ``job``'s copied blocks to ``seq`` (whose table holds the pool's hit);
        returns the pool's hit in blocks, and per block of the hit with the store's part
        whether it holds the sliding layers (what the replay plan needs)."""
        return self.kv.land(seq, job.owner, job.keys, job.loaded_blocks, job.store_blocks,
                            job.sliding_loaded, job.sliding_rows)
