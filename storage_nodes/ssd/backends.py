"""The registry of SSD I/O backends, by the name ``SSDConfig.io_backend`` gives.

Kept apart from ``io_backend`` (the interface and the ``pread`` fallback) so that the
io_uring backend, which implements that interface, is imported by the registry on use
without importing it back.
"""

from __future__ import annotations

from collections.abc import Callable

from storage_nodes.ssd.errors import SSDConfigError
from storage_nodes.ssd.io_backend import IOBackend, PreadBackend


def _make_uring(queue_depth: int) -> IOBackend:
    from storage_nodes.ssd.uring import UringBackend

    return UringBackend(queue_depth)


def make_auto(queue_depth: int) -> IOBackend:
    """io_uring where the kernel allows it, else ``pread``."""
    try:
        return _make_uring(queue_depth)
    except OSError:  # the kernel refuses io_uring; a broken liburing install raises
        return PreadBackend(queue_depth)


#: name -> factory(queue_depth). Only real backends; the test harness registers its
#: power-cut and fault-injecting wrappers (``storage_nodes.testing.ssd_backends``).
BACKENDS: dict[str, Callable[[int], IOBackend]] = {
    "auto": make_auto,
    "uring": _make_uring,
    "pread": lambda qd: PreadBackend(qd),
}


def register_backend(name: str, factory: Callable[[int], IOBackend]) -> None:
    """Make ``name`` a valid ``SSDConfig.io_backend``; a name is registered once."""
    if name in BACKENDS and BACKENDS[name] is not factory:
        raise SSDConfigError(f"ssd io backend {name!r} is already registered")
    BACKENDS[name] = factory


def make_backend(name: str, queue_depth: int) -> IOBackend:
    """Build a backend by name; ``uring`` raises ``OSError`` where io_uring is refused."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise SSDConfigError(
            f"unknown ssd io backend {name!r}; known: {sorted(BACKENDS)}"
        ) from None
    return factory(queue_depth)


def uring_available() -> bool:
    """Whether ``io_uring_queue_init`` works here. ``liburing`` is a dependency, so an
    ImportError (a broken install) propagates instead of reading as "not available"."""
    try:
        _make_uring(1).close()
        return True
    except OSError:
        return False
