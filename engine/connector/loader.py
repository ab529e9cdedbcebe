"""The background loader: a request's cached prefix, from the store into its pool blocks.

Admission hands the loader a ``LoadJob``: the chain keys of the prompt's cacheable blocks
and the pool blocks (already allocated and held by the job) that the store's part of the
hit should land in. On its own thread the loader asks the store for the longest present
prefix (``lookup`` over the whole chain, so the store sees the request as it is and the
engine learns which leading blocks the store holds), copies the blocks past the pool's
own hit into a host staging buffer (``get_into``) and from there into the pool
(``kernels.write_kv_blocks``). Running requests keep computing meanwhile.

Exact mode for a hybrid model keeps the sliding layers in a namespace of their own
(``bounded_replay.stored_namespaces``): after the primary blocks the loader copies the
sliding layers of the last window's blocks (those the pool does not hold them for) into
their pool blocks, so the request needs no replay.

The job reports what was actually copied: ``get_into`` may return fewer blocks than
``lookup`` promised (evicted in between, corrupt, the store died), and only those are
admitted. The engine gives up on a job whose deadline passes; the loader notices at its
next step and stops, and the job's blocks are released only once the thread is done with
them. Every pool block the loader writes is held by the job: the blocks it fills, and in
exact mode the pool's hit blocks whose sliding rows it completes (``pin_owner``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

import kernels
from engine.connector.store_link import StoreLink
from engine.connector.transfer import TransferThread
from engine.kv.cache import KVCache
from engine.kv.request_scope import IDENTITY, RequestScope
from kvstore.keys import Key


@dataclass(eq=False)
class LoadJob:
    owner: tuple[str, int]  # the block manager owner holding ``block_ids``
    seq_id: int
    keys: list[Key]  # the chain of the prompt's cacheable blocks, from block 0
    first_block: int  # the pool already holds blocks [0, first_block)
    block_ids: list[int]  # pool blocks for chain blocks first_block, first_block + 1, ...
    deadline_s: float  # time.monotonic() after which the engine recomputes instead
    # Exact mode, hybrid model: the sliding namespace's chain (empty: nothing to load), and
    # for the pool's part of the hit its blocks and whether they hold the sliding layers.
    sliding_keys: list[Key] = field(default_factory=list)
    pool_block_ids: list[int] = field(default_factory=list)
    pool_has_sliding: list[bool] = field(default_factory=list)
    # The owner holding the pool's hit blocks this job may write sliding rows into (its
    # own references: a request that gave up or was aborted lets go of its table, and
    # those blocks must not be another request's while the loader may still write them).
    pin_owner: tuple[str, int] | None = None
    scope: RequestScope = IDENTITY  # the request's tenant and salt (its namespaces)
    # Written by the loader thread, read by the engine after ``done`` is set.
    store_blocks: int = 0  # the store's prefix: chain blocks [0, store_blocks) are there
    loaded_blocks: int = 0  # blocks copied into block_ids[:loaded_blocks]
    tiers: tuple[str, ...] = ()  # tier that served each loaded block
    sliding_loaded: tuple[int, ...] = ()  # chain blocks whose sliding layers were copied in
    # A hybrid pool: those sliding rows, row j for sliding_loaded[j], held here for the
    # engine thread to copy into pages it gives them when the load lands.
    sliding_rows: torch.Tensor | None = None
    lookup_s: float = 0.0  # time spent in the store's lookup
    load_started_s: float = 0.0  # perf_counter() when the copy began (0: no copy)
    load_s: float = 0.0  # time spent copying the hit in (store, then pool)
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
        *,
        sliding_link: StoreLink | None = None,
        window_first_block: Callable[[int], int] | None = None,
    ) -> None:
        """``sliding_link``: the sliding layers' namespace (exact mode, hybrid model), with
        ``window_first_block(h)``, the first block the last window of an ``h``-block hit
        reaches."""
        self.call_timeout_s = call_timeout_s
        self.sliding_link = sliding_link
        self.window_first_block = window_first_block
        super().__init__("kv-loader", link, cache, layers, backend, progress)

    def _done(self, job: LoadJob) -> None:
        if job.load_started_s:
            job.load_s = time.perf_counter() - job.load_started_s
        job.done.set()

    def _remaining(self, job: LoadJob) -> float:
        return min(self.call_timeout_s, job.deadline_s - time.monotonic())

    def _work(self, job: LoadJob) -> None:
        if job.block_ids:
            self._load_primary(job)
        if job.sliding_keys:
            self._load_sliding(job)

    def _load_primary(self, job: LoadJob) -> None:
        if job.cancelled or self._remaining(job) <= 0:
            return
        started = time.perf_counter()
        found = self.link.lookup(job.keys, self._remaining(job),
                                 ns=job.scope.apply(self.link.ns))
        job.lookup_s = time.perf_counter() - started
        job.store_blocks = min(found.hit_blocks, len(job.keys))
        want = min(job.store_blocks, job.first_block + len(job.block_ids)) - job.first_block
        if want <= 0 or job.cancelled or self._remaining(job) <= 0:
            return
        job.load_started_s = time.perf_counter()
        keys = job.keys[job.first_block : job.first_block + want]
        got = self._copy_in(self.link, keys, job.block_ids[:want], job)
        job.tiers = tuple(found.tiers[job.first_block : job.first_block + got])
        job.loaded_blocks = got

    def _load_sliding(self, job: LoadJob) -> None:
        """The sliding layers of the last window's blocks that lack them."""
        link, first_of = self.sliding_link, self.window_first_block
        if link is None or first_of is None or job.cancelled or self._remaining(job) <= 0:
            return
        hit = job.first_block + job.loaded_blocks
        ids = job.pool_block_ids[: job.first_block] + job.block_ids[: job.loaded_blocks]
        lacking = [i for i in range(first_of(hit), hit)
                   if i >= job.first_block or not job.pool_has_sliding[i]]
        if not lacking:
            return
        lo = lacking[0]  # copy the run [lo, hit); blocks in it that hold them stay as they are
        got = self._copy_in(link, job.sliding_keys[lo:hit], ids[lo:hit], job,
                            only=[i - lo for i in lacking])
        job.sliding_loaded = tuple(i for i in lacking if i < lo + got)

    def _copy_in(self, link: StoreLink, keys: list[Key], block_ids: list[int], job: LoadJob,
                 only: list[int] | None = None) -> int:
        """Copy the longest present prefix of ``keys`` from ``link``'s namespace into the
        pool blocks ``block_ids`` (rows ``only`` of it, when given); returns the prefix
        length the store delivered."""
        layers = list(link.ns.cached_layers)
        staging = self.buffer.rows(len(keys), len(layers))
        got = min(link.get_into(keys, staging, self._remaining(job),
                                ns=job.scope.apply(link.ns)), len(keys))
        if got <= 0 or job.cancelled:
            return 0
        rows = [r for r in (range(got) if only is None else only) if r < got]
        if rows:
            ids = torch.tensor([block_ids[r] for r in rows], dtype=torch.int64,
                               device=self.cache.device)
            src = staging[:got] if only is None else staging[rows]
            if link is self.sliding_link and self.cache.layout.is_hybrid:
                job.sliding_rows = src.clone()  # the pages are the engine thread's to give
                return got
            kernels.write_kv_blocks(self.cache.k, self.cache.v, ids, layers, src,
                                    backend=self.backend)
            self._synchronize()  # the staging rows are reused by the next copy
        return got
