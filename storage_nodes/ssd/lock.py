"""Exclusive ownership of an SSD directory: ``flock`` on ``DIR/LOCK`` (DESIGN §6)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from storage_nodes.ssd.errors import SSDLockedError


class DirLock:
    """Held from construction until ``release``. The holder's pid is written into the
    file so a refused opener can name it; the kernel drops the lock when the holder
    dies, so a SIGKILLed owner never leaves the directory locked."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "LOCK"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise SSDLockedError(
                f"SSD directory {directory} is in use by {who} (flock on {self.path})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # a full disk: the pid is only for the refusal message
            pass
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
