"""The daemon's Parquet access log (DESIGN §8): one row per ``Lookup``.

Rows are queued by the RPC threads (an append under a lock, nothing more) and written by
one background thread into ``DIR/access-<start µs>-<seq>.parquet.open`` as row groups
every ``flush_s``. Every ``rotate_s`` (≤ 60 s) the open file is closed, fsync'd and
renamed to ``.parquet``: readers only ever see complete files, and a crash (kill -9)
loses at most the open one. ``NullAccessLog`` is the no-``--access-log`` case.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA
from kvstore.errors import IntegrityError, InvalidArgument

log = logging.getLogger(__name__)
OPEN_SUFFIX = ".parquet.open"
DONE_SUFFIX = ".parquet"


@dataclass(frozen=True, slots=True)
class AccessLogConfig:
    dir: str
    rotate_s: float = 60.0
    flush_s: float = 5.0
    max_pending_rows: int = 100_000  # past this, rows are dropped and counted

    def __post_init__(self) -> None:
        if not 0 < self.rotate_s <= 60:
            raise InvalidArgument("access-log rotation must be within (0, 60] seconds (DESIGN §8)")
        if not self.flush_s > 0:
            raise InvalidArgument("access-log flush interval must be positive")


@dataclass(frozen=True, slots=True)
class LookupRecord:
    ts_us: int
    tenant: str
    namespace: bytes
    block_tokens: int
    prompt_tokens: int
    keys: Sequence[bytes]
    hit_blocks: int
    hit_hbm: int
    hit_dram: int
    hit_ssd: int


class AccessLog(ABC):
    """Contract: ``record`` never blocks on I/O; ``close`` writes what is queued and
    leaves only complete ``.parquet`` files."""

    rows_written: int = 0
    rows_dropped: int = 0

    @abstractmethod
    def record(self, rec: LookupRecord) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def check_integrity(self) -> None:  # noqa: B027 - null object has nothing to check
        pass


class NullAccessLog(AccessLog):
    def record(self, rec: LookupRecord) -> None:
        pass

    def close(self) -> None:
        pass


class ParquetAccessLog(AccessLog):
    def __init__(
        self, config: AccessLogConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock`` (monotonic seconds) decides when the open file is rotated; tests
        inject one to rotate without sleeping. The writer still wakes every
        ``min(flush_s, rotate_s)`` of real time."""
        self.config = config
        self._clock = clock
        os.makedirs(config.dir, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: list[LookupRecord] = []
        self._stop = threading.Event()
        self._seq = 0
        self._writer: pq.ParquetWriter | None = None
        self._open_path = ""
        self._opened_at = 0.0
        self.rows_written = 0
        self.rows_dropped = 0
        self.files_closed = 0
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def record(self, rec: LookupRecord) -> None:
        with self._lock:
            if len(self._pending) >= self.config.max_pending_rows:
                self.rows_dropped += 1
                return
            self._pending.append(rec)

    def _run(self) -> None:
        tick = min(self.config.flush_s, self.config.rotate_s)
        while not self._stop.wait(tick):
            try:
                self._write_pending()
                if (
                    self._writer is not None
                    and self._clock() - self._opened_at >= self.config.rotate_s
                ):
                    self._close_file()
            except Exception:  # one bad batch or a full disk never stops the log for all
                log.exception("access log: writing failed; continuing")

    def _write_pending(self) -> None:
        with self._lock:
            rows, self._pending = self._pending, []
        if not rows:
            return
        try:
            table = self._table(rows)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            log.exception("access log: %d rows could not be encoded; dropped", len(rows))
            self.rows_dropped += len(rows)
            return
        if self._writer is None:
            self._seq += 1
            name = f"access-{time.time_ns() // 1000:016d}-{os.getpid()}-{self._seq:06d}"
            self._open_path = os.path.join(self.config.dir, name + OPEN_SUFFIX)
            self._writer = pq.ParquetWriter(self._open_path, ACCESS_LOG_SCHEMA)
            self._opened_at = self._clock()
        self._writer.write_table(table)
        self.rows_written += len(rows)

    @staticmethod
    def _table(rows: list[LookupRecord]) -> pa.Table:
        return pa.Table.from_pydict(
            {
                "ts_us": [r.ts_us for r in rows],
                "tenant": [r.tenant for r in rows],
                "namespace": [r.namespace for r in rows],
                "block_tokens": [r.block_tokens for r in rows],
                "prompt_tokens": [r.prompt_tokens for r in rows],
                "keys": [list(r.keys) for r in rows],
                "hit_blocks": [r.hit_blocks for r in rows],
                "hit_hbm": [r.hit_hbm for r in rows],
                "hit_dram": [r.hit_dram for r in rows],
                "hit_ssd": [r.hit_ssd for r in rows],
            },
            schema=ACCESS_LOG_SCHEMA,
        )

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        with open(self._open_path, "rb") as f:
            os.fsync(f.fileno())
        done = self._open_path[: -len(OPEN_SUFFIX)] + DONE_SUFFIX
        os.rename(self._open_path, done)
        dir_fd = os.open(self.config.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a power cut
        finally:
            os.close(dir_fd)
        self.files_closed += 1

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._write_pending()
        self._close_file()

    def check_integrity(self) -> None:
        with self._lock:
            if len(self._pending) > self.config.max_pending_rows:
                raise IntegrityError("access log holds more pending rows than its bound")
        if self._writer is not None and not os.path.exists(self._open_path):
            raise IntegrityError(f"open access-log file {self._open_path} vanished")


def make_access_log(dir: str | None, rotate_s: float = 60.0, flush_s: float = 5.0) -> AccessLog:
    if not dir:
        return NullAccessLog()
    return ParquetAccessLog(AccessLogConfig(dir=dir, rotate_s=rotate_s, flush_s=flush_s))
