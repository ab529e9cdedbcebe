"""Crash seams of the SSD engine and the shared-FS tier, for tests and benchmarks.

The product exposes no way to crash itself: ``SSDConfig`` calls a no-op at each of its
``CRASH_POINTS`` and the tiers stop only cleanly. These helpers reach the protected seams
behind that (``SSDConfig._crash_hook``, ``_stop_as_crashed``), so a test can crash at a named
point — inside the index commit, between the data write and its sync — in this process or,
with ``os._exit`` in the hook, as a real process death.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from storage_nodes.sharedfs.tier import SharedFSTier
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.tier import SSDTier


class SimulatedCrash(BaseException):
    """Raised by test crash hooks. A ``BaseException`` so no degraded-mode handler in
    the engine can swallow it: the crash must unwind the call like a power cut."""


def with_crash_hook(config: SSDConfig, hook: Callable[[str], None]) -> SSDConfig:
    """``config`` whose engine calls ``hook(point)`` at each of ``CRASH_POINTS``; a hook
    that raises (or exits the process) crashes the engine there."""
    out = replace(config)
    object.__setattr__(out, "_crash_hook", hook)
    return out


def abandon(tier: SSDTier | SharedFSTier) -> None:
    """Stop ``tier`` as a crash would: no flush, no commit, no clean-close marker; its
    directory (or shared-FS daemon id) is released so this process can open it again."""
    tier._stop_as_crashed()
