"""Verified row copies: move rows into a destination and check each copy's xxh3-64.

The DRAM tier's read path (DESIGN §4: every read is checked where the bytes are handed
over). Out of cache the copy is bound by memory and the hash by the core: one core
copying and then hashing pays both in turn (about 0.7× a plain memcpy on the reference
machine, however little Python there is around it). Two cores overlap them: while one
thread hashes a unit it has just copied (still in its L2), the other is copying.

Both threads work on the same task (``kvstore.row_copy_task``): each claims the next
unit from a shared counter (``next()`` on an ``itertools.count`` is atomic under the
GIL), so a helper that wakes late simply takes fewer units and the caller never waits
for it to start. The heavy calls release the GIL (``ctypes.memmove``;
``xxh3_64.update`` — the one-shot ``xxh3_64_intdigest`` does not), so the two threads
really run at once.

That is the fallback. Where the native module (``kvstore/_rowcopy.c``, built by ``make
setup``) loads, ``NativeRowCopier`` does the same in one call without the GIL: each row is
copied in L1/L2-sized chunks and each chunk hashed right after, from the destination; the
caller and a persistent helper thread that spins briefly between calls claim rows, so no
per-unit Python and no wake-up of a sleeping thread sits in the read path. At the end of a
call, the thread out of rows copies the last chunks of the row the other is on (which
hashes them, in order, from the destination), so neither core idles for most of a row
(a caller that started late, after its look-up and bookkeeping, finishes a row after the
helper, which then took it whole). A read by key
(``copy_found``) hands each row to the helper as soon as its key is found, so the look-up
and the caller's bookkeeping overlap the copy; a CPU tensor destination is given by its
address (``kvstore.buffers.AddressedRows``), not a view exported for every read.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

import xxhash
import xxhash._xxhash

from kvstore.buffers import AddressedRows, as_view
from kvstore.dram_pool import slot_offset
from kvstore.errors import InvalidArgument
from kvstore.row_copy_task import CopyTask

try:
    from kvstore import _rowcopy
except ImportError as e:  # not compiled: only where `make setup` could not build it
    _rowcopy = None  # type: ignore[assignment]
    _NATIVE_ERROR: ImportError | None = e
else:
    _NATIVE_ERROR = None

log = logging.getLogger(__name__)

#: Smaller reads are copied by the caller alone: waking the helper costs tens of µs on a
#: VM, more than it saves on less than this.
SHARE_MIN_BYTES = 1 << 20
#: Native copier: bytes copied then hashed at a time (fits L1/L2 with room to spare;
#: 8–256 KiB measured within noise of each other, bench/RESULTS.md), rows per claim
#: up to this many bytes, reads shared from this size, helper spin after each call.
NATIVE_CHUNK_BYTES = 64 << 10
NATIVE_UNIT_BYTES = 256 << 10
NATIVE_SHARE_MIN_BYTES = 512 << 10
NATIVE_SPIN_US = 100


class KeyIndex(NamedTuple):
    """Where a DRAM size class keeps its rows, as ``RowCopier.copy_found`` reads them: the
    tier's own dicts (changed in place, never replaced) from key to namespace fingerprint,
    slot id and xxh3-64 at commit, and the pool's layout (``dram_pool.slot_offset``)."""

    owner: dict[bytes, bytes]
    slots: dict[bytes, int]
    sums: dict[bytes, int]
    slots_per_chunk: int
    chunk_bytes: int


class RowCopier(ABC):
    """Copies rows of a source buffer into consecutive rows of a destination and checks
    each copy against its checksum.

    Contract: ``copy_verified`` returns how many leading rows of ``dst`` hold a copy whose
    xxh3-64 equals its entry of ``sums`` — the hash is computed from ``dst`` after the
    copy, so what passes is what the caller got. Rows past the first failing one may or
    may not have been written. When it returns, no thread writes to ``dst`` any more.
    ``during`` (optional) is called once on the caller's thread, possibly while a helper
    copies: the caller's bookkeeping overlaps the copy; it must touch neither buffer nor
    this copier; what it raises, ``copy_verified`` raises (once no thread writes to
    ``dst``).
    Callers serialise calls on one copier (the DRAM tier holds its lock).
    """

    @abstractmethod
    def copy_verified(
        self,
        src: memoryview,
        src_offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
        during: Callable[[], object] | None = None,
    ) -> int:
        """Row ``r`` = ``src[src_offsets[r] : + row_bytes]`` goes to ``dst[r * row_bytes :]``."""

    def copy_found(
        self,
        src: memoryview,
        index: KeyIndex,
        keys: Sequence[bytes],
        fingerprint: bytes,
        dst: memoryview | AddressedRows,
        row_bytes: int,
        during: Callable[[int], object] | None = None,
    ) -> tuple[int, int]:
        """A read by key: the leading ``keys`` held for ``fingerprint`` in ``index``
        (``found`` of them) are copied from their slots of ``src`` into consecutive rows of
        ``dst`` (a buffer, or memory given by its address) and checked as by
        ``copy_verified``; returns ``(found, got)``, ``got <= found``. ``during`` is called
        with ``found``, as ``copy_verified`` calls it. When the look-up raises (an index
        that disagrees with itself or with the pool), no row from the offending key on is
        written (rows before it may be). The native copier does the look-up too in its one
        call, handing rows to its helper as it finds them; this is the fallback's."""
        dst = as_view(dst)
        owner, slots, sums, per_chunk, chunk_bytes = index
        offsets, want = [], []
        for k in keys:
            if owner.get(k) != fingerprint:
                break
            offsets.append(slot_offset(slots[k], per_chunk, chunk_bytes, row_bytes))
            want.append(sums[k])
        n = len(offsets)
        then = None if during is None else lambda: during(n)
        return n, self.copy_verified(src, offsets, dst, row_bytes, want, then)

    def close(self) -> None:  # noqa: B027 - most copiers hold nothing to stop
        """Stop any helper thread; later calls still work (on the caller's thread)."""


class SerialRowCopier(RowCopier):
    """Everything on the caller's thread (one core, or reads too small to share)."""

    def copy_verified(
        self,
        src: memoryview,
        src_offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
        during: Callable[[], object] | None = None,
    ) -> int:
        task = CopyTask(src, src_offsets, dst, row_bytes, sums)
        if during is not None:
            during()
        task.work(None)
        return task.first_bad_row()


class SharedRowCopier(RowCopier):
    """The caller and one helper thread share each large call (see the module docstring)."""

    def __init__(self, share_min_bytes: int = SHARE_MIN_BYTES) -> None:
        self.share_min_bytes = share_min_bytes
        self._serial = SerialRowCopier()
        self._h = xxhash.xxh3_64()
        self._inbox: queue.SimpleQueue[CopyTask | None] | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.shared_calls = 0  # calls the helper was offered (for tests and stats)

    def _helper_inbox(self) -> queue.SimpleQueue[CopyTask | None]:
        # A forked child inherits the queue but not the thread: start a new one there.
        if self._inbox is None or self._pid != os.getpid():
            self._inbox = queue.SimpleQueue()
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._serve, args=(self._inbox,), name="row-copy-helper", daemon=True
            )
            self._thread.start()
        return self._inbox

    @staticmethod
    def _serve(inbox: queue.SimpleQueue[CopyTask | None]) -> None:
        h = xxhash.xxh3_64()
        while (task := inbox.get()) is not None:
            try:
                task.work(h)
            except BaseException as e:  # handed to the caller, never lost
                task.error = e
            finally:
                task.done.put(None)

    def copy_verified(
        self,
        src: memoryview,
        src_offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
        during: Callable[[], object] | None = None,
    ) -> int:
        if len(src_offsets) * row_bytes < self.share_min_bytes or len(src_offsets) < 2:
            return self._serial.copy_verified(src, src_offsets, dst, row_bytes, sums, during)
        task = CopyTask(src, src_offsets, dst, row_bytes, sums)
        self._helper_inbox().put(task)
        self.shared_calls += 1
        try:
            if during is not None:
                during()
            task.work(self._h)
        finally:
            # The helper may still be inside a unit it claimed: never return (or let the
            # caller reuse ``dst``) before it is out. It always signals once per task.
            if None in task.bad:
                task.done.get()
        if task.error is not None:
            raise task.error
        return task.first_bad_row()

    def close(self) -> None:
        if self._inbox is not None and self._thread is not None and self._pid == os.getpid():
            self._inbox.put(None)
            self._thread.join()
        self._inbox = self._thread = None


class NativeRowCopier(RowCopier):
    """The copy-and-check loop in C (``kvstore/_rowcopy.c``), on the caller and, for
    reads of at least ``share_min_bytes``, one helper thread. The XXH3 functions are the
    ``xxhash`` package's own (its extension module exports them; looked up by path)."""

    def __init__(
        self,
        threads: int = 2,
        *,
        chunk_bytes: int = NATIVE_CHUNK_BYTES,
        share_min_bytes: int = NATIVE_SHARE_MIN_BYTES,
        spin_us: int = NATIVE_SPIN_US,
        split_rows: bool = True,
    ) -> None:
        if _rowcopy is None:
            raise ImportError(f"kvstore._rowcopy is not built: {_NATIVE_ERROR}")
        self.threads = threads
        self._c = _rowcopy.Copier(
            xxhash._xxhash.__file__,  # its extension module exports XXH3
            InvalidArgument,
            threads=threads,
            chunk_bytes=chunk_bytes,
            unit_bytes=NATIVE_UNIT_BYTES,
            share_min_bytes=share_min_bytes,
            spin_us=spin_us,
            split_rows=split_rows,
        )

    def copy_verified(
        self,
        src: memoryview,
        src_offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
        during: Callable[[], object] | None = None,
    ) -> int:
        return int(self._c.copy_verified(src, src_offsets, dst, row_bytes, sums, during))

    def copy_found(
        self,
        src: memoryview,
        index: KeyIndex,
        keys: Sequence[bytes],
        fingerprint: bytes,
        dst: memoryview | AddressedRows,
        row_bytes: int,
        during: Callable[[int], object] | None = None,
    ) -> tuple[int, int]:
        found, got = self._c.copy_found(src, index, keys, fingerprint, dst, row_bytes, during)
        return int(found), int(got)

    def stats(self) -> dict[str, int]:
        """``shared_calls``: calls offered to the helper; ``helper_rows``: rows it did;
        ``split_chunks``: chunks of the other thread's row copied by the thread that ran
        out of rows first (``split_rows``)."""
        return dict(self._c.stats())

    @property
    def shared_calls(self) -> int:
        return self.stats()["shared_calls"]

    def close(self) -> None:
        self._c.close()


def python_row_copier(threads: int) -> RowCopier:
    return SerialRowCopier() if threads == 1 else SharedRowCopier()


def make_row_copier(threads: int | None = None, kind: str = "auto") -> RowCopier:
    """``threads``: 1 or 2; ``None`` = 2 when this process may run on more than one core.
    ``kind``: "native", "python", or "auto" = native where it loads (else python, logged)."""
    if threads is None:
        threads = 2 if len(os.sched_getaffinity(0)) > 1 else 1
    if threads not in (1, 2):
        raise InvalidArgument(f"copy threads must be 1 or 2, got {threads}")
    if kind == "python":
        return python_row_copier(threads)
    if kind not in ("native", "auto"):
        raise InvalidArgument(f"row copier must be native, python or auto, got {kind!r}")
    try:
        return NativeRowCopier(threads)
    except ImportError as e:
        if kind == "native":
            raise
        log.warning("native row copier unavailable (%s): DRAM reads use the Python one", e)
        return python_row_copier(threads)
