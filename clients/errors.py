"""Errors of the clients package: the protocol's errors (``kvstore.wire.errors``), which a
client raises as the server named them, and the client's own circuit breaker."""

from __future__ import annotations

from kvstore import errors as kv
from kvstore.wire.errors import (
    AccessDenied,
    AuthenticationFailed,
    NotAdmin,
    Overloaded,
    StagingLost,
)

__all__ = [
    "AccessDenied",
    "AuthenticationFailed",
    "CircuitOpen",
    "NotAdmin",
    "Overloaded",
    "StagingLost",
]


class CircuitOpen(kv.StoreUnavailable):
    """The store failed repeatedly; calls are skipped until the cool-down ends."""
