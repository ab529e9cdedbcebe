"""gRPC status codes for store errors, and back (DESIGN §7).

The daemon names the kvstore error class in the status details (``"UnknownNamespace:
namespace ... is not registered"``) so a client re-raises exactly the class the
embedded store would have raised, and the conformance suite sees one behaviour.
"""

from __future__ import annotations

import grpc

from kvstore import errors as kv
from kvstore.wire.errors import (
    AccessDenied,
    AuthenticationFailed,
    NotAdmin,
    Overloaded,
    StagingLost,
)

# Misuse classes a daemon may name; anything else INVALID_ARGUMENT is InvalidArgument.
_MISUSE = {
    cls.__name__: cls
    for cls in (
        kv.InvalidArgument,
        kv.InvalidTokens,
        kv.UnknownNamespace,
        kv.BufferSizeError,
        StagingLost,
    )
}

#: Codes after which a retry (within the deadline) may succeed.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
#: Codes that say "the store is not answering": they count against the circuit breaker.
UNAVAILABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)


#: gRPC's own RESOURCE_EXHAUSTED for a message over the size limit (either end): the
#: request is too large, which is misuse, not an overloaded or unreachable daemon.
_MESSAGE_TOO_LARGE = ("Sent message larger than max", "Received message larger than max")


def too_large(code: grpc.StatusCode, details: str | None) -> bool:
    """gRPC refused a message over the size limit: the request is misuse, the daemon's
    health unknown (the refusal may not even have left this process)."""
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and (details or "").startswith(
        _MESSAGE_TOO_LARGE
    )


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Server side: the status code and details to abort with for ``exc``."""
    name = type(exc).__name__
    if isinstance(exc, kv.NotDurable):  # not retried, not held against the breaker
        return grpc.StatusCode.DATA_LOSS, f"NotDurable: {exc}"
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{name}: {exc}"
    if isinstance(exc, AccessDenied):
        return grpc.StatusCode.PERMISSION_DENIED, f"{name}: {exc}"
    if isinstance(exc, kv.UnknownNamespace):
        return grpc.StatusCode.FAILED_PRECONDITION, f"{name}: {exc}"
    if isinstance(exc, ValueError):
        n = name if name in _MISUSE else "InvalidArgument"
        return grpc.StatusCode.INVALID_ARGUMENT, f"{n}: {exc}"
    if isinstance(exc, kv.BlockError):
        return grpc.StatusCode.INVALID_ARGUMENT, f"InvalidArgument: {exc}"
    if isinstance(exc, kv.IntegrityError):
        return grpc.StatusCode.INTERNAL, f"IntegrityError: {exc}"
    if isinstance(exc, kv.StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE, f"StoreUnavailable: {exc}"
    return grpc.StatusCode.INTERNAL, f"{name}: {exc}"


def error_for(code: grpc.StatusCode, details: str | None) -> kv.KVStoreError:
    """Client side: the kvstore error to raise for a failed RPC."""
    details = details or code.name
    name, _, msg = details.partition(": ")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if details.startswith(_MESSAGE_TOO_LARGE):
            return kv.InvalidArgument(f"request too large for the protocol: {details}")
        return Overloaded(msg if name == "Overloaded" else details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        if name == "NotAdmin":
            return NotAdmin(msg)
        return AccessDenied(msg or details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationFailed(f"daemon refused the token: {msg or details}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return kv.UnknownNamespace(msg or details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _MISUSE.get(name, kv.InvalidArgument)(msg or details)
    if code == grpc.StatusCode.INTERNAL and name == "IntegrityError":
        return kv.IntegrityError(msg)
    if code == grpc.StatusCode.DATA_LOSS and name == "NotDurable":
        return kv.NotDurable.from_message(msg)
    return kv.StoreUnavailable(f"{code.name.lower()}: {details}")
