"""A circuit breaker: a store that keeps failing is skipped (DESIGN §5).

Closed: calls go through; ``failure_threshold`` consecutive failures open it. Open:
calls fail at once with ``CircuitOpen`` for ``cooldown_s``. Half-open: one trial call
goes through; success closes the breaker, failure re-opens it. A dead daemon then costs
an engine one failed call per cool-down instead of a timeout per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from clients.errors import CircuitOpen
from kvstore.errors import IntegrityError

State = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 5
    cooldown_s: float = 2.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.cooldown_s < 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s >= 0")


class CircuitBreaker:
    """Thread-safe; ``clock`` is injectable so tests need no sleeps."""

    def __init__(
        self, config: BreakerConfig = BreakerConfig(), clock: Callable[[], float] = time.monotonic
    ):
        self._cfg = config
        self._clock = clock
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._trial_out = False
        self.opened_total = 0
        self.rejected_total = 0

    @property
    def state(self) -> State:
        with self._lock:
            self._maybe_half_open()
            return self._state

    def before_call(self) -> None:
        """Raise ``CircuitOpen`` if the call must be skipped."""
        with self._lock:
            self._maybe_half_open()
            if self._state == "open" or (self._state == "half_open" and self._trial_out):
                self.rejected_total += 1
                raise CircuitOpen("store skipped: circuit breaker open after repeated failures")
            if self._state == "half_open":
                self._trial_out = True

    def on_success(self) -> None:
        with self._lock:
            self._state = "closed"
            self._failures = 0
            self._trial_out = False

    def abstain(self) -> None:
        """The call ended without telling anything about the store (a request refused
        locally as misuse): count nothing, but hand a half-open trial back."""
        with self._lock:
            self._trial_out = False

    def on_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == "half_open" or self._failures >= self._cfg.failure_threshold:
                if self._state != "open":
                    self.opened_total += 1
                self._state = "open"
                self._opened_at = self._clock()
                self._trial_out = False

    def _maybe_half_open(self) -> None:
        if self._state == "open" and self._clock() - self._opened_at >= self._cfg.cooldown_s:
            self._state = "half_open"
            self._trial_out = False

    def check_integrity(self) -> None:
        with self._lock:
            if self._state not in ("closed", "open", "half_open"):
                raise IntegrityError(f"unknown breaker state {self._state!r}")
            if self._failures < 0 or (self._state == "closed" and self._trial_out):
                raise IntegrityError("breaker counters inconsistent")
