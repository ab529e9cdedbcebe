"""The reader contract and the merge rule shared by all formats."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import ClassVar

from kvstore.hitrate.request import Request

_BY_TIME = attrgetter("time_s")


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
