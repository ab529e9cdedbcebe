"""Errors the protocol adds to the kvstore hierarchy, raised by servers and by clients.

A server aborts with the status ``kvstore.wire.status.status_for`` gives; a client turns the
status back into the same class (``error_for``), so a caller of a remote store sees the
class a local store would raise.
"""

from __future__ import annotations

from kvstore import errors as kv


class WireError(kv.KVStoreError):
    """Base of the errors the protocol adds."""


class AccessDenied(WireError, kv.InvalidArgument):
    """The namespace belongs to another tenant (a misuse: the request names it)."""


class AuthenticationFailed(WireError, kv.StoreUnavailable):
    """The daemon refused the token; to an engine that is an unavailable store."""


class StagingLost(WireError, kv.InvalidArgument):
    """The daemon does not know the staging segment a request named: it restarted since
    the segment was mapped. Clients drop the mapping and fall back to the gRPC path."""


class Overloaded(WireError, kv.StoreUnavailable):
    """The daemon refused the call for now (bytes in flight at its bound, every RPC slot
    busy): RESOURCE_EXHAUSTED. Retried within the deadline like an unavailable daemon."""


class NotAdmin(AccessDenied):
    """An admin-only call (``DeleteTenant``) made with a tenant's token."""
