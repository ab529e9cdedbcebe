"""One call's deadline, retries and circuit-breaker bookkeeping.

The sync and asyncio clients differ only in how they call and how they wait; the policy
— retry only retryable codes, only while the deadline leaves room for the backoff, tell
the breaker about every outcome, report the real error rather than the breaker
when our own retries opened it, and wait for a daemon not reached yet (``FirstContact``)
— lives here once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from clients.breaker import CircuitBreaker
from clients.config import ClientConfig
from clients.errors import CircuitOpen
from kvstore.errors import KVStoreError, StoreUnavailable
from kvstore.wire.contact import NO_ANSWER, FirstContact
from kvstore.wire.status import RETRYABLE, UNAVAILABLE_CODES, error_for, too_large


class Attempts:
    """``deadline_s`` is on the ``time.monotonic`` clock; ``retry=False`` allows one attempt.
    ``contact``: the client's ``FirstContact`` (none: attempts never wait for the channel).
    ``on_no_answer``: run after each attempt the daemon did not answer (``Call.on_no_answer``)."""

    def __init__(
        self,
        breaker: CircuitBreaker,
        config: ClientConfig,
        deadline_s: float,
        *,
        retry: bool = True,
        contact: FirstContact | None = None,
        on_no_answer: Callable[[], None] | None = None,
    ) -> None:
        self._breaker = breaker
        self._on_no_answer = on_no_answer
        self._contact = contact
        self._timeout_s = deadline_s - time.monotonic()
        #: the current attempt waits for the channel to connect (gRPC's ``wait_for_ready``)
        self.wait_for_ready = False
        self._max_backoff_s = config.retry_max_backoff_s
        self._backoff_s = config.retry_initial_backoff_s
        self._deadline = deadline_s
        self._retry = retry
        self._last: KVStoreError | None = None

    def start(self) -> float:
        """Before each attempt: the seconds left. Raises when the breaker is open or the
        deadline has passed."""
        try:
            self._breaker.before_call()
        except CircuitOpen:
            if self._last is not None:  # our own retries opened it: report the real cause
                raise self._last from None
            raise
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            self._breaker.on_failure()
            raise StoreUnavailable("deadline exceeded before the call could be made")
        self.wait_for_ready = self._contact is not None and self._contact.wait_for_ready()
        return remaining

    def failed(self, code: grpc.StatusCode, details: str | None) -> float:
        """After an RPC error: the seconds to wait before the next attempt. Raises the
        mapped ``KVStoreError`` when the call must not be retried."""
        self._last = error_for(code, details)
        if self._on_no_answer is not None and code in NO_ANSWER:
            self._on_no_answer()
        if self._contact is not None:
            gave_up = self._contact.failed(
                code, details, waited=self.wait_for_ready, timeout_s=self._timeout_s
            )
            if gave_up is not None:  # it waited for the channel until the deadline
                self._breaker.on_failure()
                self._last = gave_up
                raise self._last from None
        if too_large(code, details):  # misuse, and no word from the daemon: no verdict
            self._breaker.abstain()
            raise self._last from None
        if code in UNAVAILABLE_CODES:
            self._breaker.on_failure()
        else:
            self._breaker.on_success()  # the daemon answered; the request was bad
        room_s = self._deadline - time.monotonic()
        if self._retry and code in RETRYABLE and room_s > self._backoff_s:
            wait_s = self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)
            return wait_s
        raise self._last from None

    def succeeded(self) -> None:
        if self._contact is not None:
            self._contact.saw(None)
        self._breaker.on_success()
