"""The background loader: a request's cached prefix, from the store into its pool blocks.

Admission hands the loader a ``LoadJob``: the chain keys of the prompt's cacheable blocks
and the pool blocks (already allocated and held by the job) that the store's part of the
hit should land in. On its own thread the loader asks the store for the longest present
prefix (``lookup`` over the whole chain, so the store sees the request as it is and the
engine learns which leading blocks the store holds), copies the blocks past the pool's
own hit into a host staging buffer (``get_into``) and from there into the pool
(``kernels.write_kv_blocks``). Running requests keep computing meanwhile.

The job reports what was actually copied: ``get_into`` may return fewer blocks than
``lookup`` promised (evicted in between, corrupt, the store died), and only those are
admitted. The engine gives up on a job whose deadline passes; the loader notices at its
next step and stops, and the job's blocks are released only once the thread is done with
them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import kernels
from engine.kv.cache import KVCache
from engine.kv.store_link import StoreLink
from engine.kv.transfer import TransferThread
from kvstore.keys import Key


@dataclass(eq=False)
class LoadJob:
    owner: tuple[str, int]  # the block manager owner holding ``block_ids``
    seq_id: int
    keys: list[Key]  # the chain of the prompt's cacheable blocks, from block 0
    first_block: int  # the pool already holds blocks [0, first_block)
    block_ids: list[int]  # pool blocks for chain blocks first_block, first_block + 1, ...
    deadline_s: float  # time.monotonic() after which the engine recomputes instead
    # Written by the loader thread, read by the engine after ``done`` is set.
    store_blocks: int = 0  # the store's prefix: chain blocks [0, store_blocks) are there
    loaded_blocks: int = 0  # blocks copied into block_ids[:loaded_blocks]
    tiers: tuple[str, ...] = ()  # tier that served each loaded block
    error: BaseException | None = None  # a bug, re-raised on the engine thread
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False  # set by the engine when it gives up


class KVLoader(TransferThread[LoadJob]):
    def __init__(
        self,
        link: StoreLink,
        cache: KVCache,
        layers: Sequence[int],
        backend: str | kernels.AttentionBackend | None,
        progress: threading.Event,
        call_timeout_s: float = 5.0,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        super().__init__("kv-loader", link, cache, layers, backend, progress)

    def _done(self, job: LoadJob) -> None:
        job.done.set()

    def _remaining(self, job: LoadJob) -> float:
        return min(self.call_timeout_s, job.deadline_s - time.monotonic())

    def _work(self, job: LoadJob) -> None:
        if job.cancelled or self._remaining(job) <= 0:
            return
        found = self.link.lookup(job.keys, self._remaining(job))
        job.store_blocks = min(found.hit_blocks, len(job.keys))
        want = min(job.store_blocks, job.first_block + len(job.block_ids)) - job.first_block
        if want <= 0 or job.cancelled or self._remaining(job) <= 0:
            return
        staging = self.buffer.rows(want)
        keys = job.keys[job.first_block : job.first_block + want]
        got = min(self.link.get_into(keys, staging, self._remaining(job)), want)
        if got <= 0 or job.cancelled:
            return
        ids = torch.tensor(job.block_ids[:got], dtype=torch.int64, device=self.cache.device)
        kernels.write_kv_blocks(
            self.cache.k, self.cache.v, ids, self.layers, staging[:got], backend=self.backend
        )
        self._synchronize()
        job.tiers = tuple(found.tiers[job.first_block : job.first_block + got])
        job.loaded_blocks = got
