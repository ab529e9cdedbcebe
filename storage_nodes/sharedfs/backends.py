"""The I/O backend registry: ``posix`` (``io_backend.py``: threads), ``uring`` (the same
POSIX file I/O through io_uring, ``uring_io.py``), ``usrbio`` (3FS, ``usrbio.py``) and
``auto``, which picks USRBIO on a 3FS mount when it can run, else io_uring where the
kernel allows it, else the threads.

Kept apart from ``io_backend.py`` because ``usrbio.py`` builds on that module's contract:
the registry sits above both, so nothing imports back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from storage_nodes.sharedfs.errors import BackendUnavailable, SharedFSConfigError
from storage_nodes.sharedfs.io_backend import (
    IOBackend,
    PosixBackend,
    probe_direct_io,
    probe_user_memory,
)


def _direct_and_memory(root: Path, direct: bool | None) -> tuple[bool, bool]:
    supported = probe_direct_io(root)
    if direct is True and not supported:
        raise SharedFSConfigError(f"O_DIRECT is refused by the file system under {root}")
    use = supported if direct is None else direct
    return use, use and probe_user_memory(root)


def _make_posix(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    return PosixBackend(queue_depth, *_direct_and_memory(root, direct))


def _make_uring(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    from storage_nodes.sharedfs.uring_io import UringBackend

    return UringBackend(queue_depth, *_direct_and_memory(root, direct))


def _make_usrbio(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    from storage_nodes.sharedfs.usrbio import UsrbioBackend

    return UsrbioBackend(root, queue_depth)


def _make_auto(root: Path, queue_depth: int, direct: bool | None) -> IOBackend:
    from storage_nodes.sharedfs.usrbio import is_3fs

    if is_3fs(root):
        try:
            return _make_usrbio(root, queue_depth, direct)
        except BackendUnavailable as e:
            logging.getLogger("storage_nodes.sharedfs").warning(
                "%s is on 3FS but USRBIO is unavailable (%s): using FUSE read/write", root, e
            )
    try:
        return _make_uring(root, queue_depth, direct)
    except BackendUnavailable as e:
        logging.getLogger("storage_nodes.sharedfs").warning(
            "io_uring cannot run here (%s): shared-fs I/O on threads", e)
    return _make_posix(root, queue_depth, direct)


#: name -> factory(root on the mount, queue depth, direct_io setting).
BACKENDS: dict[str, Callable[[Path, int, bool | None], IOBackend]] = {
    "auto": _make_auto,
    "posix": _make_posix,
    "uring": _make_uring,
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
