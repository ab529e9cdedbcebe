"""Errors of the hit-rate tool. All are ``InvalidArgument`` (so ``ValueError``): the CLI prints
them as one line and exits 2."""

from __future__ import annotations

from kvstore.errors import InvalidArgument


class HitrateError(InvalidArgument):
    """Base of the hit-rate tool's errors."""


class TraceError(HitrateError):
    """An input file that cannot be read as the format it claims; the message names the file
    and the line, row or JSON path."""

    def __init__(self, path: str, where: str | None, message: str) -> None:
        self.path = path
        self.where = where
        prefix = f"{path}:{where}" if where else path
        super().__init__(f"{prefix}: {message}")


class InputNotFound(HitrateError):
    """A path or glob that names no readable file."""


class ConfigError(HitrateError):
    """Flags that contradict each other or the input (e.g. mixed block sizes)."""
