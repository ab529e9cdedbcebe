"""The reader contract and the merge rule shared by all formats."""

from __future__ import annotations

import heapq
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import ClassVar

from kvstore.hitrate.batches import AccessBatch, Row, batches_of, rows_of
from kvstore.hitrate.request import Request

_BY_TIME = attrgetter("time_s")
_ROW_TIME = itemgetter(0)


class TraceReader(ABC):
    """Reads one format from a list of files (already expanded and in file-name order).

    Contract: ``requests()`` may be called more than once (a sweep without a single-pass
    method replays the input once per point) and each call re-reads the files; requests come
    merged by time, ties in file order then the file's own order; a malformed file raises
    ``TraceError`` naming the file and the line, row or JSON path.
    """

    format: ClassVar[str]

    def __init__(self, paths: Sequence[str], *, block_tokens: int | None = None) -> None:
        self.paths = list(paths)
        self.block_tokens = block_tokens
        # For the progress bar: bytes of input consumed so far, and the run's block accesses
        # where a format knows them before the end (kv-cache-tester, once loaded).
        self.bytes_done = 0
        self.total_accesses: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    @abstractmethod
    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        """The requests of one file, in that file's replay order."""

    def requests(self) -> Iterator[Request]:
        if len(self.paths) == 1:
            return self.file_requests(0, self.paths[0])
        # heapq.merge is stable: equal times come from the earlier file first.
        return heapq.merge(
            *(self.file_requests(i, p) for i, p in enumerate(self.paths)), key=_BY_TIME
        )

    # -- compact arrays for the one-pass engine ------------------------------------------

    def file_rows(self, index: int, path: str) -> Iterator[Row]:
        """The file's requests as ``(time_s, L, uint64 keys, B)`` (formats override this
        to skip the ``Request`` objects)."""
        return rows_of(self.file_requests(index, path))

    def file_batches(self, index: int, path: str) -> Iterator[AccessBatch]:
        return batches_of(self.file_rows(index, path))

    def batches(self) -> Iterator[AccessBatch]:
        """The same requests, in the same order as ``requests()``, as ``AccessBatch``es."""
        if len(self.paths) == 1:
            return self.file_batches(0, self.paths[0])
        return batches_of(
            heapq.merge(*(self.file_rows(i, p) for i, p in enumerate(self.paths)), key=_ROW_TIME)
        )
