"""Whether a server has answered a client yet (DESIGN §5): its first calls wait for it.

A gRPC channel that found nothing listening ("connection refused") does not try again at
once: it waits its reconnect backoff (``kvstore.wire.channel.CHANNEL_OPTIONS``), and a call
made meanwhile fails at once with UNAVAILABLE. A client started just before its server
(an engine and ``kvstore serve`` started together; a daemon and its storage nodes) would
then fail its first calls — its own retries would open its circuit breaker, the cluster's
probes would eject the node — although the server came up well inside the call's
deadline. So until the server has answered once, attempts are made with gRPC's
``wait_for_ready``: they wait for the channel to connect, within the call's deadline.

A call that waited its whole deadline without an answer fails with one line naming the
address (``failed`` returns it), and the client stops waiting: a server that is absent,
not just starting, costs one deadline, not one per call (an engine's scheduler asks on
every request); later calls fail fast, as every call does once the server has answered,
and the client's own fault handling (the daemon client's circuit breaker, the cluster's
ejection) bounds what an outage costs. The channel keeps reconnecting meanwhile, so a
server that comes up later is used from its first answer.

One implementation for every client of the protocol: the daemon clients
(``clients.attempts``) and the cluster's node client (``storage_nodes.cluster``).
"""

from __future__ import annotations

import threading

import grpc

from kvstore.errors import StoreUnavailable

#: The codes of an attempt the server did not answer (any other came from the server).
NO_ANSWER = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class FirstContact:
    """Thread-safe; one per channel, shared by all its calls. ``server`` and ``hint`` word
    the give-up line (``"kv store"``; what to check), ``error`` is the class it raises."""

    def __init__(
        self,
        target: str,
        *,
        server: str = "kv store",
        hint: str = "is `kvstore serve` listening on that address?",
        error: type[StoreUnavailable] = StoreUnavailable,
    ) -> None:
        self.target = target
        self._server = server
        self._hint = hint
        self._error = error
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

    def failed(
        self, code: grpc.StatusCode, details: str | None, *, waited: bool, timeout_s: float
    ) -> StoreUnavailable | None:
        """After a failed attempt made with ``wait_for_ready=waited`` and a deadline of
        ``timeout_s``: the error to raise when it waited that whole deadline for a server
        that never answered (``gave_up``), else None."""
        self.saw(code)
        if waited and code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return self.gave_up(timeout_s, details)
        return None

    def gave_up(self, timeout_s: float, details: str | None) -> StoreUnavailable:
        """The error of a call that waited its whole deadline, ``timeout_s``, for a server
        that never answered; later calls no longer wait."""
        with self._lock:
            if self._state == "waiting":
                self._state = "gave_up"
        why = " ".join((details or "no answer").split())
        return self._error(
            f"{self._server} {self.target} is not reachable: nothing answered there within "
            f"{timeout_s:.1f} s ({why}); {self._hint}"
        )
