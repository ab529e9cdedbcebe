"""Host memory for commits on their way to the store: a bounded ring of payload rows.

When a request finishes, the engine copies the blocks its commit sends out of the pool at
once, on its own thread, into rows taken here, and lets go of the pool blocks: a slow store
then holds host rows, never pool blocks a waiting request needs. The committer thread sends
the rows and gives them back. Commits are best-effort under back-pressure: ``take`` never
waits; when the ring is short it hands out the rows it has (the commit sends its chain's
head, the part the store keeps first) or, with ``max_jobs`` commits already staged,
nothing at all. The caller counts what was left out.

The committer works through its jobs in order, so rows come back in the order they were
taken: one contiguous span per job, allocated at the ring's tail and freed at its head.
``take`` runs on the engine thread and ``give_back`` on the committer's; a lock guards them.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass

import torch

from engine.errors import EngineIntegrityError
from engine.kv.cache import KVCache


@dataclass(eq=False, slots=True)
class Span:
    """Elements ``[start, end)`` of the ring, held by one staged commit."""

    start: int
    end: int
    freed: bool = False


class CommitStaging:
    def __init__(self, cache: KVCache, capacity_bytes: int, max_jobs: int) -> None:
        self.cache = cache
        self.capacity = capacity_bytes // cache.storage.element_size()  # in elements
        self.max_jobs = max_jobs
        self._flat: torch.Tensor | None = None  # allocated at the first rows taken
        self._spans: deque[Span] = deque()  # oldest first
        self._lock = threading.Lock()

    def row_numel(self, num_layers: int) -> int:
        s = self.cache.shape
        return num_layers * 2 * s.block_tokens * s.kv_heads * s.head_dim

    @property
    def num_jobs(self) -> int:
        with self._lock:
            return len(self._spans)

    def take(self, n_rows: int, num_layers: int) -> tuple[torch.Tensor, Span] | None:
        """At most ``n_rows`` payload rows of ``num_layers`` layers (``[n, num_layers, 2,
        block_tokens, kv_heads, head_dim]``): as many as fit now, maybe none. None when
        ``max_jobs`` commits are staged already. Never waits."""
        row = self.row_numel(num_layers)
        with self._lock:
            if len(self._spans) >= self.max_jobs:
                return None
            live = [sp for sp in self._spans if sp.end > sp.start]  # empty ones hold none
            start, room = self._room(live)
            n = min(n_rows, room // row) if row else n_rows
            if n < n_rows and live and not self._wrapped(live):
                head = live[0].start  # the ring's start may fit more
                if head // row > n:
                    start, n = 0, min(n_rows, head // row)
            span = Span(start, start + n * row)
            self._spans.append(span)
        s = self.cache.shape
        shape = (n, num_layers, 2, s.block_tokens, s.kv_heads, s.head_dim)
        if n == 0:
            return torch.empty(shape, dtype=s.dtype), span
        return self._buffer()[span.start : span.end].view(shape), span

    def give_back(self, span: Span) -> None:
        with self._lock:
            span.freed = True
            while self._spans and self._spans[0].freed:
                self._spans.popleft()

    @staticmethod
    def _wrapped(live: list[Span]) -> bool:
        """The newest span lies before the oldest: free room is between them. Only spans
        holding rows say where the ring is (an empty one may sit at either end)."""
        return live[-1].start < live[0].start

    def _room(self, live: list[Span]) -> tuple[int, int]:
        """Where the next span starts, and how many elements it may take there, given the
        live spans holding rows (oldest first)."""
        if not live:
            return 0, self.capacity
        tail = live[-1].end
        limit = live[0].start if self._wrapped(live) else self.capacity
        return tail, limit - tail

    def _buffer(self) -> torch.Tensor:
        if self._flat is None:
            dtype, cuda = self.cache.shape.dtype, self.cache.device.type == "cuda"
            self._flat = torch.empty(self.capacity, dtype=dtype, pin_memory=cuda)
        return self._flat

    def check_integrity(self) -> None:
        """Live spans lie inside the ring, in order, and never overlap."""
        with self._lock:
            spans = list(self._spans)
        live = sorted((s.start, s.end) for s in spans if s.end > s.start)
        for (_, end), (start, _) in itertools.pairwise(live):
            if start < end:
                raise EngineIntegrityError(f"staging spans overlap: {live}")
        if live and (live[0][0] < 0 or live[-1][1] > self.capacity):
            raise EngineIntegrityError(f"a staging span lies outside the ring: {live}")
