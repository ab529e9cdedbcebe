"""The SSD engine's error hierarchy.

Only misuse and open-time failures escape a ``Tier`` method: I/O errors, ENOSPC and
corrupt blocks are turned into misses, drops and a degraded mode (DESIGN §6), so
``SSDIOError`` is raised inside the engine and caught at its boundary.
"""

from __future__ import annotations

from kvstore.errors import InvalidArgument, KVStoreError


class SSDError(KVStoreError):
    """Base of every error raised by ``storage_nodes.ssd``."""


class SSDConfigError(SSDError, InvalidArgument):
    """An ``SSDConfig`` that cannot work (sizes, queue depth, unknown backend)."""


class SSDLockedError(SSDError):
    """Another process (or another open tier in this one) holds ``DIR/LOCK``."""


class SSDFormatError(SSDError):
    """The directory holds a layout this build cannot open with this config."""


class SSDIOError(SSDError):
    """A read, write or sync failed; carries the errno. Never leaves the tier."""

    def __init__(self, message: str, errno_: int = 0) -> None:
        super().__init__(message)
        self.errno = errno_

