"""Node health: ejection after consecutive failures, re-admission after good probes.

Calls report their outcome (``success``/``failure``); a background prober checks every
node's ``grpc.health.v1`` status each ``probe_interval_s`` (a node that has not answered
yet is not judged by probes: calls wait for it, see ``kvstore.wire.contact``). An
ejected node gets no traffic except probes, so a dead node costs callers nothing once
ejected, and it returns to service on its own when it answers again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.errors import IntegrityError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _NodeState:
    healthy: bool = True
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive, counted while ejected


class HealthTracker:
    def __init__(
        self, members: Sequence[str], eject_after_failures: int, readmit_after_successes: int
    ) -> None:
        self.members = tuple(members)
        self._eject_after = eject_after_failures
        self._readmit_after = readmit_after_successes
        self._states = [_NodeState() for _ in members]
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter(ejections=0, readmissions=0, node_failures=0)

    def healthy(self, i: int) -> bool:
        return self._states[i].healthy

    def snapshot(self) -> tuple[bool, ...]:
        with self._lock:
            return tuple(s.healthy for s in self._states)

    def success(self, i: int, *, probe: bool = False) -> None:
        with self._lock:
            s = self._states[i]
            s.failures = 0
            if s.healthy:
                return
            if not probe:
                return  # only probes re-admit: an ejected node gets no calls anyway
            s.successes += 1
            if s.successes >= self._readmit_after:
                s.healthy = True
                s.successes = 0
                self.counters["readmissions"] += 1
                log.warning("storage node %s re-admitted", self.members[i])

    def failure(self, i: int) -> None:
        with self._lock:
            s = self._states[i]
            s.successes = 0
            s.failures += 1
            self.counters["node_failures"] += 1
            if s.healthy and s.failures >= self._eject_after:
                s.healthy = False
                self.counters["ejections"] += 1
                log.warning(
                    "storage node %s ejected after %d failures", self.members[i], s.failures
                )

    def check_integrity(self) -> None:
        with self._lock:
            for m, s in zip(self.members, self._states, strict=True):
                if s.failures < 0 or s.successes < 0:
                    raise IntegrityError(f"node {m}: negative failure/success count")
                if s.healthy and s.successes:
                    raise IntegrityError(f"node {m}: healthy but counting re-admission probes")
            if self.counters["readmissions"] > self.counters["ejections"]:
                raise IntegrityError("more re-admissions than ejections")


class Prober:
    """Calls ``probe(i)`` for every node each interval, in its own thread: True healthy,
    False a failure, None no verdict (a node not reached yet, which calls still wait for:
    ``kvstore.wire.contact``), which neither ejects nor re-admits it."""

    def __init__(
        self, tracker: HealthTracker, probe: Callable[[int], bool | None], interval_s: float
    ) -> None:
        self._tracker = tracker
        self._probe = probe
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="kvstore-cluster-prober", daemon=True
        )
        self._thread.start()

    def probe_all(self) -> None:
        for i in range(len(self._tracker.members)):
            if self._stop.is_set():
                return
            try:
                ok = self._probe(i)
            except Exception:  # a probe must never kill the prober
                ok = False
            if ok is None:
                continue
            if ok:
                self._tracker.success(i, probe=True)
            else:
                self._tracker.failure(i)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.probe_all()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
