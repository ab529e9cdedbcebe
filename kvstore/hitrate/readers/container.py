"""A trace file's container (JSON text, Parquet, Arrow IPC), told by its first bytes."""

from __future__ import annotations

import enum

from kvstore.hitrate.errors import TraceError


class Container(enum.Enum):
    JSON = "json"
    PARQUET = "parquet"
    ARROW_FILE = "arrow-file"
    ARROW_STREAM = "arrow-stream"


def read_head(path: str, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except IsADirectoryError:
        raise TraceError(path, None, "is a directory") from None
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror}") from None


def container_of(path: str) -> Container:
    head = read_head(path, 8)
    if head.startswith(b"PAR1"):
        return Container.PARQUET
    if head.startswith(b"ARROW1"):
        return Container.ARROW_FILE
    if head.startswith(b"\xff\xff\xff\xff"):
        return Container.ARROW_STREAM
    return Container.JSON
