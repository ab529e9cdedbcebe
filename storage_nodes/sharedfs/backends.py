"""The I/O backend registry: ``posix`` (``io_backend.py``), ``usrbio`` (3FS, ``usrbio.py``)
and ``auto``, which picks USRBIO on a 3FS mount when it can run and POSIX elsewhere.

Kept apart from ``io_backend.py`` because ``usrbio.py`` builds on that module's contract:
the registry sits above both, so nothing imports back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from storage_nodes.sharedfs.errors import BackendUnavailable, SharedFSConfigError
from storage_nodes.sharedfs.io_backend import (
    IOBackend,
    PosixBackend,
    probe_direct_io,
    probe_user_memory,
)


def _make_posix(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    supported = probe_direct_io(root)
    if direct is True and not supported:
        raise SharedFSConfigError(f"O_DIRECT is refused by the file system under {root}")
    use = supported if direct is None else direct
    return PosixBackend(queue_depth, use, use and probe_user_memory(root))


def _make_usrbio(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    from storage_nodes.sharedfs.usrbio import UsrbioBackend

    return UsrbioBackend(root, queue_depth)


def _make_auto(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    from storage_nodes.sharedfs.usrbio import is_3fs

    if is_3fs(root):
        try:
            return _make_usrbio(root, queue_depth, direct)
        except BackendUnavailable as e:
            import logging

            logging.getLogger("storage_nodes.sharedfs").warning(
                "%s is on 3FS but USRBIO is unavailable (%s): using FUSE read/write", root, e
            )
    return _make_posix(root, queue_depth, direct)


#: name -> factory(root on the mount, queue depth, direct_io setting).
BACKENDS: dict[str, Callable[[Path, int, bool | None], IOBackend]] = {
    "auto": _make_auto,
    "posix": _make_posix,
    "usrbio": _make_usrbio,
}


def make_backend(name: str, root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise SharedFSConfigError(
            f"unknown shared-fs io backend {name!r}; known: {sorted(BACKENDS)}"
        ) from None
    return factory(root, queue_depth, direct)
