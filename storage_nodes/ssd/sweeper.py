"""Retention: remove blocks idle longer than ``retention_s``, and the background thread
that runs it and flushes batched touches."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from itertools import islice

from kvstore.errors import StoreUnavailable
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.index import Index
from storage_nodes.ssd.recency import Recency

log = logging.getLogger("storage_nodes.ssd")
_SWEEP_BATCH = 10_000


def sweep_expired(config: SSDConfig, index: Index, recency: Recency) -> int:
    """Delete every block whose last-access bucket is older than retention; return how
    many. Runs in bounded transactions so a huge backlog never holds the writer long.
    Pending touches are applied first, so a block touched a second ago is never swept."""
    cutoff = config.expiry_bucket(config.clock())
    total = 0
    first = True
    while True:
        with index.write() as txn:
            if first:
                recency.flush_into(index, txn)
                first = False
            batch = list(islice(index.iter_lru(txn, below_bucket=cutoff), _SWEEP_BATCH))
            for fk in batch:
                loc = index.get(txn, fk)
                if loc is not None:
                    index.remove(txn, fk, loc)
        total += len(batch)
        if len(batch) < _SWEEP_BATCH:
            return total


class Maintenance:
    """A daemon thread: flush touches when a batch is due, sweep every interval, probe a
    degraded directory every ``probe_interval_s``.

    Scheduling uses the monotonic clock; *what* is expired uses the config's clock."""

    def __init__(
        self,
        config: SSDConfig,
        flush: Callable[[], None],
        sweep: Callable[[], int],
        touches_due: Callable[[], bool],
        probe_if_due: Callable[[], None],
    ) -> None:
        self._config = config
        self._flush, self._sweep, self._due = flush, sweep, touches_due
        self._probe = probe_if_due
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ssd-maintenance", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = min(
            self._config.touch_flush_s,
            self._config.sweep_interval_s or 1.0,
            self._config.probe_interval_s,
            1.0,
        )
        next_sweep = time.monotonic() + (self._config.sweep_interval_s or float("inf"))
        while not self._stop.wait(tick):
            try:
                self._probe()
                if self._due():
                    self._flush()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + (self._config.sweep_interval_s or float("inf"))
                    self._sweep()
            except StoreUnavailable:
                return  # the tier is closing
            except Exception:  # the tier degrades and logs; the thread must survive
                log.exception("ssd maintenance step failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
