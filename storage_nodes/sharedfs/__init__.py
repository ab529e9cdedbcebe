"""The shared-FS tier: the SSD tier of many daemons on one distributed file system.

Each daemon writes only its own large segment files and its own append-only manifest
per namespace on the mount; every daemon tails every peer's manifests and reads every
peer's segments, header-verified. See README.md for the layout, the multi-host rules,
sizing and the 3FS (USRBIO) path.
"""

from storage_nodes.sharedfs.config import SharedFSConfig
from storage_nodes.sharedfs.errors import (
    SharedFSConfigError,
    SharedFSError,
    SharedFSLockedError,
)
from storage_nodes.sharedfs.tier import SharedFSTier

__all__ = [
    "SharedFSConfig",
    "SharedFSConfigError",
    "SharedFSError",
    "SharedFSLockedError",
    "SharedFSTier",
]
