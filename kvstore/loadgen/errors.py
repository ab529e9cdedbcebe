"""Errors of the load generator. Bad input is ``InvalidArgument`` (a ``ValueError``), so the
CLI prints one line and exits 2; wrong bytes are not an exception but a failed run (exit 1)."""

from __future__ import annotations

from kvstore.errors import InvalidArgument


class LoadgenError(InvalidArgument):
    """Flags or inputs the load generator cannot use."""
