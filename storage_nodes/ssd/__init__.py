"""The SSD engine: slab files of fixed slots, io_uring I/O, an LMDB index, checksummed
blocks, 72-hour retention and crash-safe group commit (DESIGN §4–§6)."""

from storage_nodes.ssd.config import CRASH_POINTS, SSDConfig
from storage_nodes.ssd.errors import (
    SSDConfigError,
    SSDError,
    SSDFormatError,
    SSDIOError,
    SSDLockedError,
)
from storage_nodes.ssd.tier import SSDTier

__all__ = [
    "CRASH_POINTS",
    "SSDConfig",
    "SSDConfigError",
    "SSDError",
    "SSDFormatError",
    "SSDIOError",
    "SSDLockedError",
    "SSDTier",
]
