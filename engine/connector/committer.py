"""The background committer: a finished request's new blocks, from host rows into the store.

When a request finishes, every full block of its sequence (prompt and generated tokens)
whose K/V was computed and that the store is not known to hold goes to the store. The
engine copies those blocks out of the pool at once, on its own thread (``stage``:
``kernels.read_kv_blocks`` into rows of the bounded ``CommitStaging`` ring), lets go of the
pool blocks, and hands the committer a ``CommitJob`` holding the rows. On its own thread the
committer calls ``store.commit`` with the whole chain, so the store also refreshes the
recency of the part it already had, and gives the rows back. A slow store therefore holds
host rows, never pool blocks; when the rows run out, commits are cut short or dropped
(counted by the link as ``commit_unsent_blocks_total``) and the engine never waits. The
commit's outcome comes back separately: the engine marks the blocks the store accepted as
stored, so later requests do not send them again.

A job names the store link (so the namespace, and the layers its blocks carry) it goes
to: exact mode for a hybrid model commits a request's full-attention layers and its
sliding layers as two jobs, to two namespaces of the same chain.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import kernels
from engine.connector.commit_staging import CommitStaging, Span
from engine.connector.handoff import CommitReceipt
from engine.connector.store_link import StoreLink
from engine.connector.transfer import TransferThread
from engine.kv.cache import KVCache
from engine.kv.request_scope import IDENTITY, RequestScope
from kvstore.keys import Key
from kvstore.tier import CommitResult

#: Commits staged at once (queued or in the store): past it a finished request sends nothing.
MAX_STAGED_COMMITS = 256


@dataclass(eq=False)
class Staged:
    """Rows copied out of the pool for one commit, and the span of the ring they hold."""

    rows: torch.Tensor
    span: Span


@dataclass(eq=False)
class CommitJob:
    link: StoreLink  # where the blocks go: its namespace's layers were copied out
    keys: list[Key]  # the chain of the sequence's full computed blocks, from block 0
    indices: list[int]  # chain blocks to send (ascending): the store lacks them
    block_ids: list[int]  # the pool blocks they were copied from
    pool_keys: list[Key]  # the keys the pool indexes those blocks by (the primary chain)
    staged: Staged  # their bytes, row j for indices[j]
    scope: RequestScope = IDENTITY  # the request's tenant and salt (its namespace)
    # Told when the job is over (engine.connector.handoff): the request's own receipt (a
    # prefill replica's), and its prefill commit's.
    receipts: tuple[CommitReceipt, ...] = ()
    # Written by the committer thread.
    result: CommitResult | None = None
    error: BaseException | None = None


class KVCommitter(TransferThread[CommitJob]):
    def __init__(
        self,
        link: StoreLink,
        cache: KVCache,
        layers: Sequence[int],
        backend: str | kernels.AttentionBackend | None,
        progress: threading.Event,
        timeout_s: float = 30.0,
        staging_bytes: int = 1 << 30,
        max_staged: int = MAX_STAGED_COMMITS,
    ) -> None:
        self.timeout_s = timeout_s
        self.staging = CommitStaging(cache, staging_bytes, max_staged)
        super().__init__("kv-committer", link, cache, layers, backend, progress)

    def stage(self, link: StoreLink, block_ids: Sequence[int],
              pages: dict[int, list[int]] | None = None) -> Staged | None:
        """On the engine thread: copy the head of ``block_ids`` that fits into staging rows
        (``link``'s layers; the pool blocks may be reused once this returns). ``pages``:
        per KV group the pages of those blocks, for a hybrid pool (``KVCache.read_rows``).
        None when no commit can be staged now. Never waits for the store."""
        layers = list(link.ns.cached_layers)
        got = self.staging.take(len(block_ids), len(layers))
        if got is None:
            return None
        rows, span = got
        if len(rows):
            # The rows hold the bytes when this returns (the kernel waits for a GPU copy
            # into pinned rows): the blocks may be overwritten by the next step.
            try:
                n = len(rows)
                if pages is not None:
                    self.cache.read_rows({g: p[:n] for g, p in pages.items()}, layers, rows,
                                         backend=self.backend)
                else:
                    ids = torch.tensor(list(block_ids[:n]), dtype=torch.int64,
                                       device=self.cache.device)
                    kernels.read_kv_blocks(self.cache.k, self.cache.v, ids, layers, rows,
                                           backend=self.backend)
            except BaseException:
                self.staging.give_back(span)
                raise
        return Staged(rows, span)

    def _work(self, job: CommitJob) -> None:
        try:
            rows = job.staged.rows
            payloads = {i: rows[j] for j, i in enumerate(job.indices)}
            job.result = job.link.commit(job.keys, payloads, self.timeout_s,
                                         ns=job.scope.apply(job.link.ns))
        finally:
            self.staging.give_back(job.staged.span)

    def _done(self, job: CommitJob) -> None:
        res = job.result
        ok = job.error is None and res is not None and not res.dropped
        for receipt in job.receipts:
            receipt.report(ok)
