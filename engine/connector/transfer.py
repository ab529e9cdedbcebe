"""What the loader and the committer share: a thread that works through store transfers
in order, and a reused host buffer in the store's payload layout (DESIGN §4).

The engine thread submits jobs and, each step, collects the finished ones
(``finished()``); a worker never touches the block manager. A job that raises is handed
back with ``error`` set. Store failures never raise (the ``StoreLink`` turns them into
misses), so an error here is a bug (in a store client, say); still, the engine takes it as
a miss like any store trouble (``note_job_error``: counted, logged with its traceback
once), so that every other job of the step is taken in and nothing stays held.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

import torch

import kernels
from engine.connector.store_link import StoreLink
from engine.kv.cache import KVCache
from kernels.threads import pin_helper_thread, thread_plan
from kvstore.buffers import io_buffer

log = logging.getLogger("engine.store")


class Job(Protocol):
    error: BaseException | None


J = TypeVar("J", bound=Job)


def drain(q: queue.Queue[J]) -> list[J]:
    out: list[J] = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def note_job_error(what: str, err: BaseException, counters: Counter[str]) -> None:
    """A transfer job failed with ``err`` (a bug, not store trouble): counted under
    ``<what>_errors_total``, the first of each kind logged with its traceback."""
    key = f"{what}_errors_total"
    counters[key] += 1
    if counters[key] == 1:
        log.error("a store %s failed; it counts as a miss (later failures are only counted)",
                  what, exc_info=err)


class PayloadBuffer:
    """Rows of ``[num_layers, 2, block_tokens, kv_heads, head_dim]`` in the pool's dtype,
    one allocation reused by every transfer (pinned when the pool is on a GPU): a fresh
    buffer per transfer would pay its page faults every time. ``num_layers`` defaults to
    the thread's layers; exact mode for a hybrid model also moves the sliding layers' own
    namespace through the same buffer."""

    def __init__(self, cache: KVCache, layers: Sequence[int]) -> None:
        self.cache = cache
        self.num_layers = len(layers)
        self._flat: torch.Tensor | None = None

    def rows(self, n: int, num_layers: int | None = None) -> torch.Tensor:
        s = self.cache.shape
        layers = self.num_layers if num_layers is None else num_layers
        shape = (layers, 2, s.block_tokens, s.kv_heads, s.head_dim)
        row = layers * 2 * s.block_tokens * s.kv_heads * s.head_dim
        if self._flat is None or self._flat.numel() < n * row:
            self._flat = self._alloc(n * row, s.dtype)
        return self._flat[: n * row].view(n, *shape)

    def _alloc(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        if self.cache.device.type == "cuda":
            return torch.empty(numel, dtype=dtype, pin_memory=True)
        # On the CPU, page-aligned memory on huge pages (kvstore.buffers.io_buffer): the
        # SSD tier then reads straight into these rows (torch's allocator aligns to 64
        # bytes, which forced a staging copy) and each block's read is one contiguous
        # segment for the disk.
        # the tensor holds a reference to the mapping: it lives as long as any row does
        return torch.frombuffer(io_buffer(numel * dtype.itemsize), dtype=dtype, count=numel)


class TransferThread(ABC, Generic[J]):
    def __init__(
        self,
        name: str,
        link: StoreLink,
        cache: KVCache,
        layers: Sequence[int],
        backend: str | kernels.AttentionBackend | None,
        progress: threading.Event,
    ) -> None:
        self.link = link
        self.cache = cache
        self.layers = list(layers)
        self.backend = backend
        self.buffer = PayloadBuffer(cache, layers)
        self._progress = progress  # set whenever the engine has something to collect
        self._jobs: queue.Queue[J | None] = queue.Queue()
        self._finished: queue.Queue[J] = queue.Queue()
        self._idle = threading.Condition()
        self._unfinished = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @abstractmethod
    def _work(self, job: J) -> None:
        """Do one job on the worker thread."""

    def submit(self, job: J) -> None:
        with self._idle:
            self._unfinished += 1
        self._jobs.put(job)

    def finished(self) -> list[J]:
        """Jobs the thread is done with, in the order it finished them."""
        return drain(self._finished)

    @property
    def unfinished(self) -> int:
        """Jobs submitted and not yet over (queued or running)."""
        with self._idle:
            return self._unfinished

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted job is finished (False if the timeout passed)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout_s)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _notify(self) -> None:
        self._progress.set()

    def _run(self) -> None:
        pin_helper_thread(thread_plan())  # its copies must not compete with the step's
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._work(job)
            except BaseException as e:
                job.error = e
            finally:
                self._done(job)
                self._finished.put(job)
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()
                self._notify()

    def _done(self, job: J) -> None:
        """Hook run on the worker thread when ``job`` is over, before it is handed back."""

    def _synchronize(self) -> None:
        """A GPU copy must be over before the buffer is reused or handed to the store."""
        if self.cache.device.type == "cuda":
            torch.cuda.current_stream(self.cache.device).synchronize()
