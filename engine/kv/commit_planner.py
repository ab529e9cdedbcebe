"""What the store gets of a finished request, and what it is then known to hold.

When a request finishes, the blocks of its sequence (prompt and generated tokens) that
hold a store link's layers and that the store is not known to hold go, per link, to the
background committer (``engine.kv.committer``) as a ``CommitJob``, their bytes copied
out of the pool into bounded staging rows first (so the pool blocks go back at once, and a
slow store never holds them; under back-pressure a commit is cut short or dropped, never
waited for). The primary link's chain is always
sent, even when nothing in it is new: the commit refreshes the store's recency. Exact
mode for a hybrid model sends the sliding layers to their own namespace, only when some
block has them to send. Once the store answered, the pool blocks it accepted (and that
were not reused meanwhile) are marked stored, so later requests do not send them again;
after a commit that dropped any block, none are (the result does not say which).

It stands apart from the scheduler (``engine.scheduler``), which decides when a request
finishes; this decides, from each block's layers, what goes to the store.
"""

from __future__ import annotations

from collections import Counter

from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import KVBlock
from engine.kv.committer import CommitJob, KVCommitter
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.store_link import StoreLink
from engine.kv.transfer import note_job_error
from engine.sequence import Sequence
from kvstore.keys import Namespace


class CommitPlanner:
    """Commits for finished sequences over ``links`` (the primary first); ``counters``:
    the scheduler's (failed commits are counted there)."""

    def __init__(
        self,
        blocks: BlockManager,
        ns: Namespace,
        links: tuple[StoreLink, ...],
        planner: ReplayPlanner,
        committer: KVCommitter,
        counters: Counter[str],
    ) -> None:
        self.blocks = blocks
        self.ns = ns
        self.links = links
        self.planner = planner
        self.committer = committer
        self.counters = counters

    def submit(self, seq: Sequence, owner: tuple[str, int], full: int) -> None:
        """Send the first ``full`` blocks of the finished ``seq`` (held by ``owner``) that
        the store lacks, one job per link. Their bytes are copied out of the pool now (the
        caller may release the blocks at once); under back-pressure a job sends the head
        its staging rows hold, or is dropped, and the link counts the blocks left out."""
        table = self.blocks.table(owner)[:full]
        held, stored = self._layers_of(seq, table)
        pool_keys = seq.block_keys(self.ns)
        for link in self.links:
            layers = frozenset(link.ns.cached_layers)
            send = [i for i in range(full) if layers <= held[i] and not layers <= stored[i]]
            if link is not self.links[0] and not send:
                continue  # the primary chain is always sent: it refreshes recency
            staged = self.committer.stage(link, [table[i].block_id for i in send])
            kept = 0 if staged is None else len(staged.rows)
            if kept < len(send):
                link.note_unsent(len(send) - kept)
            if staged is None:
                continue
            if not kept and send and link is not self.links[0]:
                self.committer.staging.give_back(staged.span)
                continue
            send = send[:kept]
            receipt = seq.commit_receipt
            if receipt is not None:
                receipt.expect()
            try:
                self.committer.submit(CommitJob(
                    link=link, keys=seq.block_keys(link.ns)[:full], indices=send,
                    block_ids=[table[i].block_id for i in send],
                    pool_keys=[pool_keys[i] for i in send], staged=staged, scope=seq.scope,
                    receipt=receipt))
            except BaseException:
                if receipt is not None:
                    receipt.report(False)
                self.committer.staging.give_back(staged.span)
                raise

    def _layers_of(self, seq: Sequence, table: list[KVBlock]
                   ) -> tuple[list[frozenset[int]], list[frozenset[int]]]:
        """Per block of a finished sequence, the layers it holds and those the store is
        known to hold: an indexed block records both; the sequence computed every layer of
        the blocks past its hit; a private copy of a hit block holds the primary layers,
        stored as its original was."""
        hit = seq.plan.hit_blocks if seq.plan is not None else 0
        held: list[frozenset[int]] = []
        stored: list[frozenset[int]] = []
        none: frozenset[int] = frozenset()
        for i, b in enumerate(table):
            if b.key is not None:
                held.append(b.layers)
                stored.append(b.stored_layers)
            elif i >= hit:
                held.append(self.planner.computed_layers)
                stored.append(none)
            else:
                held.append(self.planner.primary_layers)
                stored.append(seq.copied_stored_layers.get(i, none))
        return held, stored

    def poll(self) -> None:
        """Take in the committer's reports: mark stored what the store accepted. A failed
        job is counted (a miss)."""
        for job in self.committer.finished():
            if job.error is not None:
                note_job_error("commit", job.error, self.counters)
                continue
            self._mark_stored(job)

    def _mark_stored(self, job: CommitJob) -> None:
        """The store answered ``job``: mark the pool blocks it accepted as stored."""
        res = job.result
        if res is None or res.dropped:
            # A commit that dropped blocks does not say which: the ones already present
            # may sit anywhere among those sent, and the drops fall among the new ones
            # (their tail, or wherever the top tier refused). Marking none costs a resend
            # of what was stored; marking a dropped block would keep it out of the store
            # for as long as the pool holds it.
            return
        layers = frozenset(job.link.ns.cached_layers)
        for block_id, key in zip(job.block_ids, job.pool_keys, strict=True):
            block = self.blocks.pool.blocks[block_id]
            # Not reused since the copy (same key, and holding the layers sent).
            if block.key == key and layers <= block.layers:
                block.stored_layers |= layers
