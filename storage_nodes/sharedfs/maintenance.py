"""The background thread of a ``SharedFSTier``: tail peers, publish touches, heartbeat,
compact manifests, expire and collect. Each job runs on its own period; a failing job
is logged and counted (``maintenance_errors``), never fatal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("storage_nodes.sharedfs")

COMPACT_CHECK_S = 5.0


class Maintenance:
    def __init__(self, jobs: list[tuple[str, float, Callable[[], object]]],
                 on_error: Callable[[], None]) -> None:
        self._jobs = jobs
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sharedfs-maint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        now = time.monotonic()
        due = {name: now + period for name, period, _ in self._jobs}
        while not self._stop.is_set():
            wake = min(due.values(), default=now + 1.0)
            if self._stop.wait(max(0.0, wake - time.monotonic())):
                return
            now = time.monotonic()
            for name, period, job in self._jobs:
                if due[name] > now:
                    continue
                due[name] = now + period
                try:
                    job()
                except Exception:
                    if self._stop.is_set():
                        return
                    self._on_error()
                    log.exception("shared-fs maintenance job %s failed", name)

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
