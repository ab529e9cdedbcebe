"""Recognise a file's container (JSON text, Parquet, Arrow IPC) and trace format by content."""

from __future__ import annotations

import enum

from kvstore.hitrate.errors import TraceError

_PEEK_BYTES = 1 << 16


class Container(enum.Enum):
    JSON = "json"
    PARQUET = "parquet"
    ARROW_FILE = "arrow-file"
    ARROW_STREAM = "arrow-stream"


def _head(path: str, n: int = _PEEK_BYTES) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except IsADirectoryError:
        raise TraceError(path, None, "is a directory") from None
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror}") from None


def container_of(path: str) -> Container:
    head = _head(path, 8)
    if head.startswith(b"PAR1"):
        return Container.PARQUET
    if head.startswith(b"ARROW1"):
        return Container.ARROW_FILE
    if head.startswith(b"\xff\xff\xff\xff"):
        return Container.ARROW_STREAM
    return Container.JSON


def table_columns(path: str) -> list[str]:
    """Column names of a Parquet or Arrow file."""
    from kvstore.hitrate.readers.columnar import table_schema

    return list(table_schema(path).names)


def sniff_format(path: str) -> str:
    """``mooncake``, ``kv-cache-tester`` or ``access-log``; ``TraceError`` if none fits."""
    if container_of(path) is not Container.JSON:
        names = set(table_columns(path))
        if {"ts_us", "keys"} <= names:
            return "access-log"
        if {"hash_ids", "input_length"} <= names:
            return "mooncake"
        raise TraceError(
            path, None, f"columns {sorted(names)} are neither an access log nor Mooncake"
        )
    head = _head(path)
    if not head.strip():
        raise TraceError(path, None, "empty file")
    first_line = head.split(b"\n", 1)[0]
    mooncake_keys = b'"hash_ids"' in first_line and b'"timestamp"' in first_line
    if b'"input_length"' in first_line or (mooncake_keys and b'"requests"' not in first_line):
        return "mooncake"
    if b'"requests"' in head or b'"block_size"' in head:
        return "kv-cache-tester"
    raise TraceError(path, "1", "cannot tell the trace format; pass --format")
