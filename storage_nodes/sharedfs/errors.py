"""Errors of the shared-FS tier. Misuse is a ``ValueError`` (``InvalidArgument``), as
everywhere in the store; I/O trouble on the mount never raises into callers (it is a
miss or a dropped put, counted), except at open, where it is fatal and explained."""

from __future__ import annotations

from kvstore.errors import InvalidArgument, KVStoreError


class SharedFSError(KVStoreError):
    """Base of the errors this package raises."""


class SharedFSConfigError(SharedFSError, InvalidArgument):
    """A configuration the tier cannot run with (bad sizes, bad daemon id, wrong mount)."""


class SharedFSLockedError(SharedFSError):
    """Another process holds this daemon id's directory (DESIGN §6's flock rule)."""


class ManifestError(SharedFSError):
    """A manifest that cannot be parsed at all (wrong magic, unknown format version)."""


class LeaseLost(SharedFSError):
    """A collector's lease was taken over (a higher fencing token exists) or ran out."""


class BackendUnavailable(SharedFSError):
    """An I/O backend that cannot run here (USRBIO without a 3FS mount or its library)."""
