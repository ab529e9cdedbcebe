"""The background committer: a finished request's new blocks, from the pool into the store.

When a request finishes, every full block of its sequence (prompt and generated tokens)
whose K/V was computed and that the store is not known to hold goes to the store. The
engine hands the committer a ``CommitJob`` that holds a reference on those pool blocks; on
its own thread the committer copies them into a host buffer in the store's payload layout
(``kernels.read_kv_blocks``), reports the copy done (the engine then drops the job's
references: only from that moment may the blocks be reused) and then calls
``store.commit`` with the whole chain, so the store also refreshes the recency of the part
it already had. The commit's outcome comes back separately: the engine marks the blocks
the store accepted as stored, so later requests do not send them again.

A job names the store link (so the namespace, and the layers its blocks carry) it goes
to: exact mode for a hybrid model commits a request's full-attention layers and its
sliding layers as two jobs, to two namespaces of the same chain.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import kernels
from engine.kv.cache import KVCache
from engine.kv.request_scope import IDENTITY, RequestScope
from engine.kv.store_link import StoreLink
from engine.kv.transfer import TransferThread, drain
from kvstore.keys import Key
from kvstore.tier import CommitResult


@dataclass(eq=False)
class CommitJob:
    owner: tuple[str, int]  # the block manager owner holding ``block_ids``
    link: StoreLink  # where the blocks go: its namespace's layers are copied out
    keys: list[Key]  # the chain of the sequence's full computed blocks, from block 0
    indices: list[int]  # chain blocks to send (ascending): the store lacks them
    block_ids: list[int]  # their pool blocks
    pool_keys: list[Key]  # the keys the pool indexes those blocks by (the primary chain)
    scope: RequestScope = IDENTITY  # the request's tenant and salt (its namespace)
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
    ) -> None:
        self.timeout_s = timeout_s
        self._copied: queue.Queue[CommitJob] = queue.Queue()
        super().__init__("kv-committer", link, cache, layers, backend, progress)

    def copied(self) -> list[CommitJob]:
        """Jobs whose blocks are in host memory: their pool references may go. (Every job
        shows up here before ``finished``, failed ones included.)"""
        return drain(self._copied)

    def _work(self, job: CommitJob) -> None:
        try:
            rows = self._copy_out(job)
        finally:
            self._copied.put(job)
            self._notify()
        payloads = {i: rows[j] for j, i in enumerate(job.indices)}
        job.result = job.link.commit(job.keys, payloads, self.timeout_s,
                                     ns=job.scope.apply(job.link.ns))

    def _copy_out(self, job: CommitJob) -> torch.Tensor:
        # One reused buffer: the next job's copy starts only after this commit returned.
        layers = list(job.link.ns.cached_layers)
        rows = self.buffer.rows(len(job.block_ids), len(layers))
        if job.block_ids:
            ids = torch.tensor(job.block_ids, dtype=torch.int64, device=self.cache.device)
            kernels.read_kv_blocks(
                self.cache.k, self.cache.v, ids, layers, rows, backend=self.backend
            )
            self._synchronize()
        return rows
