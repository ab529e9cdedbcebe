"""The one reader of the small text files commands are given (configs, token files,
prompts): every way a file can be unusable becomes one ``InvalidArgument`` that names the
file and the flag that gave it, never a bare ``'utf-8' codec can't decode…``."""

from __future__ import annotations

import os

from kvstore.errors import InvalidArgument


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` names where the path came from (``--config``,
    ``--auth-token-file``), so the error says which of a command's files is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidArgument(f"{what} {path}: cannot read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"{what} {path}: cannot read (not UTF-8 text: byte {e.start})"
        ) from None
