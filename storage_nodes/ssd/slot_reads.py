"""A batch of slot reads whose requests are built as the I/O backend first asks for them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from storage_nodes.ssd.index import Location
from storage_nodes.ssd.io_backend import IORequest


class SlotReads(Sequence[IORequest]):
    """One batch's slot reads, each built when the backend first asks for it: io_uring
    hands the kernel the first reads while the later ones are still being built, so the
    device starts on a call's reads before the whole batch is prepared. Request ``j``
    reads slot ``part[j]`` (its file already open, ``fds[j]``): direct, its header page
    into staging and its payload into row ``start + j`` of ``out``; else the whole slot
    into staging."""

    def __init__(
        self,
        part: Sequence[Location],
        fds: Sequence[int],
        slot_bytes: int,
        staging: memoryview,
        stage: int,
        out: memoryview,
        block_bytes: int,
        start: int,
        direct: bool,
    ) -> None:
        self._part, self._fds, self._sb = part, fds, slot_bytes
        self._staging, self._stage = staging, stage
        self._out, self._bb, self._start, self._direct = out, block_bytes, start, direct
        self._built: list[IORequest | None] = [None] * len(part)

    def __len__(self) -> int:
        return len(self._built)

    @overload
    def __getitem__(self, j: int) -> IORequest: ...

    @overload
    def __getitem__(self, j: slice) -> list[IORequest]: ...

    def __getitem__(self, j: int | slice) -> IORequest | list[IORequest]:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        r = self._built[j]
        if r is None:
            j = range(len(self._built))[j]
            at = self._staging[j * self._stage : (j + 1) * self._stage]
            pos = self._part[j].slot * self._sb
            if self._direct:
                i = self._start + j
                row = self._out[i * self._bb : (i + 1) * self._bb]
                r = IORequest(self._fds[j], pos, row, head=at)
            else:
                r = IORequest(self._fds[j], pos, at)
            self._built[j] = r
        return r
