"""Whether the daemon has answered this client yet (DESIGN §5): its first calls wait for it.

A gRPC channel that found nothing listening ("connection refused") does not try again at
once: it waits its reconnect backoff (``kvstore.wire.channel.CHANNEL_OPTIONS``), and a call
made meanwhile fails at once with UNAVAILABLE. A client started just before its daemon
(an engine and ``kvstore serve`` started together) would then fail its first calls, and
its own retries would open the circuit breaker, although the daemon came up well inside
the call's deadline. So until the daemon has answered once, attempts are made with gRPC's
``wait_for_ready``: they wait for the channel to connect, within the call's deadline.

A call that waited its whole deadline without an answer fails with one line naming the
address (``gave_up``), and the client stops waiting: a daemon that is absent, not just
starting, costs one deadline, not one per call (an engine's scheduler asks on every
request); later calls fail fast, as every call does once the daemon has answered, and the
circuit breaker bounds what an outage costs. The channel keeps reconnecting meanwhile, so
a daemon that comes up later is used from its first answer.
"""

from __future__ import annotations

import threading

import grpc

from kvstore.errors import StoreUnavailable

#: The codes of an attempt the daemon did not answer (any other came from the daemon).
NO_ANSWER = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class FirstContact:
    """Thread-safe; one per client (its channel), shared by all its calls."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._state = "waiting"  # -> "answered" | "gave_up"; "gave_up" -> "answered"

    @property
    def state(self) -> str:
        return self._state

    def wait_for_ready(self) -> bool:
        """What the next attempt passes as gRPC's ``wait_for_ready``."""
        return self._state == "waiting"

    def saw(self, code: grpc.StatusCode | None) -> None:
        """After an attempt: ``None`` when it succeeded, else its status code."""
        if code is None or code not in NO_ANSWER:
            with self._lock:
                self._state = "answered"

    def gave_up(self, timeout_s: float, details: str | None) -> StoreUnavailable:
        """The error of a call that waited its whole deadline, ``timeout_s``, for a daemon
        that never answered; later calls no longer wait."""
        with self._lock:
            if self._state == "waiting":
                self._state = "gave_up"
        why = " ".join((details or "no answer").split())
        return StoreUnavailable(
            f"kv store {self.target} is not reachable: nothing answered there within "
            f"{timeout_s:.1f} s ({why}); is `kvstore serve` listening on that address?"
        )
