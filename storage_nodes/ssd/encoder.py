"""Encoding a group's payloads into aligned staging on a thread of its own.

O_DIRECT writes need page-aligned memory, so every payload is copied once into the
staging slots behind its header. numpy's copy and xxhash release the GIL, so on this
thread the copy (and the checksum, when the caller has none) runs on another core while
the writer packs headers and the kernel takes the submissions of the blocks before it:
the copy leaves the put's critical path instead of adding to it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from itertools import pairwise

import numpy as np
import xxhash

from kvstore.block import HEADER_BYTES


class Encoder:
    """One worker thread, shared by every put of a tier (their chunks queue in order)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="ssd-encode")
            return self._pool

    def start(
        self,
        stage: memoryview,
        slot_bytes: int,
        data: memoryview,
        block_bytes: int,
        rows: Sequence[int],
        chunk: int,
        hash_rows: bool,
        payload_offset: int = HEADER_BYTES,
        copy: bool = True,
    ) -> EncodeJob:
        """Copy ``data`` row ``rows[j]`` to ``payload_offset`` in staging slot ``j`` for
        every ``j``, ``chunk`` slots per task; with ``hash_rows`` each copy's xxh3 is
        taken. Without ``copy`` (the payload is written from ``data`` itself) only the
        rows are hashed."""
        n = len(rows)
        src = np.frombuffer(data, np.uint8).reshape(-1, block_bytes)
        if copy:
            dst = np.frombuffer(stage, np.uint8, count=n * slot_bytes).reshape(n, slot_bytes)
            body = dst[:, payload_offset : payload_offset + block_bytes]
        else:
            body = None

        def task(lo: int, hi: int) -> list[int]:
            r = rows[lo:hi]
            digest = xxhash.xxh3_64_intdigest
            if body is None:
                return [digest(src[i]) for i in r] if hash_rows else []
            if r[-1] - r[0] == hi - lo - 1 and all(b - a == 1 for a, b in pairwise(r)):
                np.copyto(body[lo:hi], src[r[0] : r[-1] + 1])  # one GIL-free call
            else:
                for j, i in zip(range(lo, hi), r, strict=True):
                    np.copyto(body[j], src[i])
            if not hash_rows:
                return []
            return [digest(body[j]) for j in range(lo, hi)]

        pool = self._executor()
        futures = [pool.submit(task, lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
        return EncodeJob(futures, chunk)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class EncodeJob:
    def __init__(self, futures: list[Future[list[int]]], chunk: int) -> None:
        self._futures = futures
        self._chunk = chunk

    def ready(self, j: int) -> list[int]:
        """Wait until slot ``j`` is copied; the checksums of its chunk (if hashed).
        Raises what the copy raised."""
        return self._futures[j // self._chunk].result()

    def finish(self) -> None:
        """Wait for every task (the staging buffer is reused after this); cancels the
        ones not started."""
        for f in self._futures:
            f.cancel()
        wait(self._futures)
