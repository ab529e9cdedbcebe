"""What the store gets of a finished request, and what it is then known to hold.

When a request finishes, the blocks of its sequence (prompt and generated tokens) that
hold a store link's layers and that the store is not known to hold go, per link, to the
background committer (``engine.connector.committer``) as a ``CommitJob``, their bytes copied
out of the pool into bounded staging rows first (so the pool blocks go back at once, and a
slow store never holds them; under back-pressure a commit is cut short or dropped, never
waited for). The primary link's chain is always sent, even when nothing in it is new: the
commit refreshes the store's recency. A hybrid model's sliding layers go to their own
namespace, only when some block has them to send: exact mode sends every block's; bounded
mode only the **window tail** of the committed end (``ReplayPlanner.tail``: the blocks the
next token's sliding layers see, so a session's next turn, which hits exactly there, needs
no replay), and only whole: a tail lacking a block (rows given back, a replay's unwritten
ones) or cut short by back-pressure is not sent. Once the store answered, the pool blocks
it accepted (and that were not reused meanwhile) are marked stored, so later requests do
not send them again; after a commit that dropped any block, none are (the result does not
say which).

It is the store connector's (``engine.connector.store_connector``): the scheduler decides
when a request finishes, this what goes to the store, from each block's layers as the KV
manager (``engine.kv.kv_manager``) records them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from engine.connector.committer import CommitJob, KVCommitter
from engine.connector.handoff import CommitReceipt
from engine.connector.store_link import StoreLink
from engine.connector.transfer import note_job_error
from engine.core.sequence import Sequence
from engine.kv.kv_manager import KVManager
from engine.kv.sliding_tables import WindowListener


class CommitPlanner(WindowListener):
    """Commits for finished sequences over ``links`` (the primary first); ``counters``:
    the engine's (failed commits are counted there)."""

    def __init__(
        self,
        kv: KVManager,
        links: tuple[StoreLink, ...],
        committer: KVCommitter,
        counters: Counter[str],
    ) -> None:
        self.kv = kv
        self.links = links
        self.committer = committer
        self.counters = counters

    def submit(self, seq: Sequence, full: int, start: int = 0,
               receipts: tuple[CommitReceipt, ...] = ()) -> int:
        """Send blocks ``[start, full)`` of ``seq`` (still holding its table) that the store
        lacks, one job per link; the blocks before ``start`` went in an earlier job of this
        request (its prefill's, ``StoreConnector.on_prefilled``). Their bytes are copied out
        of the pool now (the caller may free the blocks at once); under back-pressure a job
        sends the head its staging rows hold, or is dropped, and the link counts the blocks
        left out. ``receipts`` (besides the request's own) are told when each job is over.
        Returns the leading blocks the jobs covered: ``full``, or where the first block
        left out under back-pressure lies."""
        receipts = (*self._own_receipt(seq), *receipts)
        tail = self.kv.planner.tail(full)
        return min((self._submit(seq, link, range(start, full), full, receipts)
                    if link is self.links[0] or tail is None
                    else self._submit(seq, link, tail, full, receipts, whole=True)
                    for link in self.links), default=full)

    def leaving(self, seq: Sequence, indices: list[int]) -> None:
        """A hybrid pool is about to give back the sliding rows of ``seq``'s chain blocks
        ``indices`` (they left its window): exact mode sends them now, to the sliding
        layers' namespace, as the finished request's commit would have. Best-effort."""
        try:
            for link in self.links[1:]:
                self._submit(seq, link, indices, indices[-1] + 1, self._own_receipt(seq))
        except Exception as e:
            note_job_error("commit", e, self.counters)

    @staticmethod
    def _own_receipt(seq: Sequence) -> tuple[CommitReceipt, ...]:
        return (seq.commit_receipt,) if seq.commit_receipt is not None else ()

    def _submit(self, seq: Sequence, link: StoreLink, indices: Iterable[int], full: int,
                receipts: tuple[CommitReceipt, ...], *, whole: bool = False) -> int:
        """One job for ``link``: the blocks among ``indices`` (of ``seq``'s first ``full``)
        that hold its layers and that the store lacks. ``whole`` (a window tail): all of
        them or nothing, as a hit needs every block of a window. Returns ``full``, or the
        first block back-pressure left out."""
        kv = self.kv
        block_ids = kv.block_ids(seq)[:full]
        layers_of = kv.layers_of(seq, full)
        held, stored = layers_of.held, layers_of.stored
        pool_keys = kv.keys(seq)
        layers = frozenset(link.ns.cached_layers)
        indices = list(indices)
        if whole and not all(layers <= held[i] | stored[i] for i in indices):
            return full  # a tail with a hole: no hit could use it
        send = [i for i in indices if layers <= held[i] and not layers <= stored[i]]
        if link is not self.links[0] and not send:
            return full  # the primary chain is always sent: it refreshes recency
        staged = self.committer.stage(link, [block_ids[i] for i in send],
                                      kv.row_pages(seq, send))
        kept = 0 if staged is None else len(staged.rows)
        covered = full
        if kept < len(send):
            link.note_unsent(len(send) - kept)
            covered = send[kept]
        if staged is None:
            return covered
        if (not kept or (whole and kept < len(send))) and send \
                and link is not self.links[0]:
            self.committer.staging.give_back(staged.span)
            return covered
        send = send[:kept]
        for receipt in receipts:
            receipt.expect()
        try:
            self.committer.submit(CommitJob(
                link=link, keys=kv.keys(seq, link.ns)[:full], indices=send,
                block_ids=[block_ids[i] for i in send],
                pool_keys=[pool_keys[i] for i in send], staged=staged, scope=seq.scope,
                receipts=receipts))
        except BaseException:
            for receipt in receipts:
                receipt.report(False)
            self.committer.staging.give_back(staged.span)
            raise
        return covered

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
        self.kv.mark_stored(job.block_ids, job.pool_keys, frozenset(job.link.ns.cached_layers))
