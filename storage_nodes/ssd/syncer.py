"""When a put's data becomes durable against power loss (``SSDConfig.data_sync``).

A cache may forget its last writes on a power cut as long as it never serves a wrong
byte (every slot's header names its key and carries its checksum, and every read checks
both; after a power cut the fast mode rebuilds the index from those headers). So in the
default mode a put does not wait for a data sync: it returns once its writes completed,
and a syncer thread runs the syncs behind the puts — rounds ``data_sync_interval_s``
(50 ms) apart, each covering every slab written before it began. The device's queue
then never waits for a sync: the next put's writes go in beside it, which is what
``fio --fdatasync`` measures too. Nothing is promised that is not kept: ``sync()``
(the tier manager's ``flush()`` and ``durability="ssd"`` commits, the storage node
before it acknowledges a put, a clean close) waits for the round that covers every put
acknowledged before it.

``PerPutSync`` is the other policy, a null object: each put syncs its own data before it
publishes (``per_put``, and always in strict index mode), so there is nothing to wait for.
"""

from __future__ import annotations

import errno
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from kvstore.errors import IntegrityError, StoreUnavailable
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.io_backend import IOBackend

log = logging.getLogger("storage_nodes.ssd")


class DataSync(ABC):
    """Contract:

    * ``per_put``: whether a put syncs its own data (``BlockIO`` then writes and syncs in
      one batch, and the put is durable when it returns).
    * ``written(slabs)``: a put wrote these slabs and is about to return; call it once
      the writes completed (and were published), before acknowledging.
    * ``publishing(slabs)``: around the commit that publishes a put's writes to these
      slabs; notes them ``written`` as it commits, and meanwhile no round begins and no
      ``sync`` takes its target — so whoever sees the published blocks (another put
      finding its keys present) is covered by its next ``sync``.
    * ``sync(timeout_s)``: once it returns True, every write ``written`` before the call
      is durable. False: some of them could not be made durable (a failed sync, reported
      once, to the first ``sync`` that covers it; the tier counts it as an I/O error).
      Never raises for I/O; ``StoreUnavailable`` when ``timeout_s`` passes first.
    * ``close()``: a final sync, then stop (a clean close); ``abandon()``: stop at once,
      syncing nothing (a crash); both idempotent, after either no write may be noted.
    """

    per_put: bool

    @abstractmethod
    def written(self, slabs: Iterable[int]) -> None: ...

    @contextmanager
    def publishing(self, slabs: Iterable[int]) -> Iterator[None]:
        yield
        self.written(slabs)

    @abstractmethod
    def sync(self, timeout_s: float | None = None) -> bool: ...

    @abstractmethod
    def close(self) -> bool: ...

    @abstractmethod
    def abandon(self) -> None: ...

    @abstractmethod
    def rounds(self) -> int:
        """Sync rounds run so far (a stats counter)."""

    @abstractmethod
    def check_integrity(self) -> None: ...


class PerPutSync(DataSync):
    """Each put is durable when it returns: nothing is ever pending."""

    per_put = True

    def written(self, slabs: Iterable[int]) -> None:
        """The put synced these itself."""

    def sync(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> bool:
        return True

    def abandon(self) -> None:
        """No thread to stop."""

    def rounds(self) -> int:
        return 0

    def check_integrity(self) -> None:
        """Nothing to check: no state."""


class BehindSync(DataSync):
    """A thread syncing, round after round, every slab written since the last round.

    ``_noted`` counts ``written`` calls; a round takes the dirty slabs and the count at
    its start, and once its syncs succeeded every call up to that count is durable
    (``_synced``). A failed round still advances ``_synced`` (retrying a failed
    ``fdatasync`` proves nothing on Linux: the kernel reports an error once) but leaves
    its range in ``_failed`` until a ``sync`` covering it reports it."""

    per_put = False

    def __init__(
        self,
        config: SSDConfig,
        io: IOBackend,
        fd_of: Callable[[int], int],
        on_error: Callable[[SSDIOError], None],
    ) -> None:
        self._crash = config.crash_point
        self._interval_s = config.data_sync_interval_s
        self._waiting = 0  # ``sync`` calls waiting: the next round starts at once
        self._io = io
        self._fd_of = fd_of
        self._on_error = on_error
        self._cond = threading.Condition()
        self._dirty: dict[int, None] = {}  # slabs written since the last round began
        self._noted = 0
        self._synced = 0
        self._failed: list[int] = []  # the ``_noted`` mark of each failed, unreported round
        self._rounds = 0
        self._idle = False  # waiting for a slab to be written (not in its pause)
        self._stopping = False
        self._abandoned = False
        self._dead: str | None = None  # why the thread ended, once it has
        self._thread = threading.Thread(target=self._run, name="ssd-data-sync", daemon=True)
        self._thread.start()

    @contextmanager
    def publishing(self, slabs: Iterable[int]) -> Iterator[None]:
        with self._cond:  # a Condition's lock is reentrant: ``written`` takes it again
            yield
            self.written(slabs)

    def written(self, slabs: Iterable[int]) -> None:
        slabs = dict.fromkeys(slabs)
        if not slabs:  # nothing to sync: counted, it would hold every later ``sync``
            return  # waiting for a round that only dirty slabs start
        with self._cond:
            self._dirty.update(slabs)
            self._noted += 1
            if self._idle:
                # Only a syncer waiting for work is woken: in its pause between rounds
                # it would wake on every put just to find the pause not over, taking the
                # GIL from the putting thread each time (one caller's puts: +4.7 %).
                self._cond.notify_all()

    def sync(self, timeout_s: float | None = None) -> bool:
        with self._cond:
            target = self._noted
            self._waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(
                    lambda: self._synced >= target or self._dead is not None, timeout_s
                )
            finally:
                self._waiting -= 1
            if self._synced < target:
                if self._dead is None:
                    raise StoreUnavailable("the SSD data sync did not finish before its deadline")
                return False  # the thread ended before its round: nothing more gets synced
            failed = [m for m in self._failed if m <= target]
            self._failed = [m for m in self._failed if m > target]
            return not failed

    def close(self) -> bool:
        ok = self.sync()
        self._stop()
        return ok

    def abandon(self) -> None:
        with self._cond:
            self._abandoned = True
        self._stop()

    def rounds(self) -> int:
        with self._cond:
            return self._rounds

    def check_integrity(self) -> None:
        with self._cond:
            if not 0 <= self._synced <= self._noted:
                raise IntegrityError(
                    f"data sync: {self._synced} synced of {self._noted} noted writes"
                )
            if any(m > self._synced for m in self._failed):
                raise IntegrityError("data sync: a failed round beyond the synced mark")

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        why = "stopped"
        try:
            while self._round():
                pass
        except Exception as e:  # a syncer that cannot run must not pass for one that did
            log.exception("SSD data syncer failed")
            why = f"failed: {e}"
            self._on_error(SSDIOError(f"the data syncer failed: {e}", errno.EIO))
        except BaseException as e:  # a simulated crash inside a hook: the thread just ends
            why = f"ended: {type(e).__name__}"
        finally:
            with self._cond:
                self._dead = why
                self._cond.notify_all()

    def _round(self) -> bool:
        """One round; False once stopping with nothing left to sync."""
        with self._cond:
            self._idle = True
            self._cond.wait_for(lambda: self._dirty or self._stopping)
            self._idle = False
            if self._abandoned or not self._dirty:
                return False
        self._crash("before_data_sync")
        with self._cond:
            slabs, self._dirty = list(self._dirty), {}
            mark = self._noted
        res = self._sync_slabs(slabs)
        bad = [r for r in res if r < 0]
        if bad:
            err = -bad[0]
            self._on_error(SSDIOError(f"data sync of {len(bad)} slab files failed", err))
        else:
            self._crash("after_data_sync")
        with self._cond:
            if bad:
                self._failed.append(mark)
            self._synced = mark
            self._rounds += 1
            self._cond.notify_all()
            # The pause that makes rounds (and device flushes) rarer — counted from the
            # end of a round, so the device gets that long with writes only; a waiting
            # ``sync`` or a close cuts it short.
            self._cond.wait_for(lambda: self._waiting or self._stopping, self._interval_s)
        return True

    def _sync_slabs(self, slabs: Sequence[int]) -> list[int]:
        try:
            fds = [self._fd_of(s) for s in slabs]
        except SSDIOError as e:
            return [-(e.errno or errno.EIO)]
        res = self._io.sync(fds)
        return res if len(res) == len(fds) else [*res, -errno.EIO]


def make_data_sync(
    config: SSDConfig,
    io: IOBackend,
    fd_of: Callable[[int], int],
    on_error: Callable[[SSDIOError], None],
) -> DataSync:
    if config.sync_per_put:
        return PerPutSync()
    return BehindSync(config, io, fd_of, on_error)
