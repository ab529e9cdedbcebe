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
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import kernels
from engine.kv.cache import KVCache
from engine.kv.store_link import StoreLink
from kvstore.keys import Key
from kvstore.tier import CommitResult


@dataclass(eq=False)
class CommitJob:
    owner: tuple[str, int]  # the block manager owner holding ``block_ids``
    keys: list[Key]  # the chain of the sequence's full computed blocks, from block 0
    first_block: int  # chain blocks [0, first_block) are known to be in the store
    block_ids: list[int]  # pool blocks of chain blocks first_block, first_block + 1, ...
    # Written by the committer thread.
    result: CommitResult | None = None
    error: BaseException | None = None


class KVCommitter:
    def __init__(
        self,
        link: StoreLink,
        cache: KVCache,
        layers: Sequence[int],
        backend: str | kernels.AttentionBackend | None,
        progress: threading.Event,
        timeout_s: float = 30.0,
    ) -> None:
        self.link = link
        self.cache = cache
        self.layers = list(layers)
        self.backend = backend
        self.timeout_s = timeout_s
        self._progress = progress
        self._jobs: queue.Queue[CommitJob | None] = queue.Queue()
        self._copied: queue.Queue[CommitJob] = queue.Queue()
        self._committed: queue.Queue[CommitJob] = queue.Queue()
        self._buffer: torch.Tensor | None = None
        self._idle = threading.Condition()
        self._unfinished = 0
        self._thread = threading.Thread(target=self._run, name="kv-committer", daemon=True)
        self._thread.start()

    def submit(self, job: CommitJob) -> None:
        with self._idle:
            self._unfinished += 1
        self._jobs.put(job)

    def copied(self) -> list[CommitJob]:
        """Jobs whose blocks are in host memory: their pool references may go."""
        return _drain(self._copied)

    def committed(self) -> list[CommitJob]:
        """Jobs whose ``store.commit`` returned (``result``) or failed (``error``)."""
        return _drain(self._committed)

    @property
    def busy(self) -> bool:
        with self._idle:
            return self._unfinished > 0

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted job is committed (or the timeout passes)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout_s)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    # -- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            copied = False
            try:
                rows = self._copy_out(job)
                copied = True
                self._copied.put(job)
                self._progress.set()
                payloads = {job.first_block + j: rows[j] for j in range(len(job.block_ids))}
                job.result = self.link.commit(job.keys, payloads, self.timeout_s)
            except BaseException as e:  # a bug, not a store failure: the engine re-raises
                job.error = e
                if not copied:
                    self._copied.put(job)
            finally:
                self._committed.put(job)
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()
                self._progress.set()

    def _copy_out(self, job: CommitJob) -> torch.Tensor:
        n = len(job.block_ids)
        s = self.cache.shape
        if self._buffer is None or self._buffer.shape[0] < n:
            # One reused buffer: the next job's copy starts only after this commit returned.
            self._buffer = torch.empty(
                (n, len(self.layers), 2, s.block_tokens, s.kv_heads, s.head_dim),
                dtype=s.dtype,
                pin_memory=self.cache.device.type == "cuda",
            )
        rows = self._buffer[:n]
        if n:
            ids = torch.tensor(job.block_ids, dtype=torch.int64, device=self.cache.device)
            kernels.read_kv_blocks(
                self.cache.k, self.cache.v, ids, self.layers, rows, backend=self.backend
            )
        return rows


def _drain(q: queue.Queue[CommitJob]) -> list[CommitJob]:
    out: list[CommitJob] = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
