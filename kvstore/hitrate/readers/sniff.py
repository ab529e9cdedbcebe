"""Recognise a file's trace format by content (its container: ``container``)."""

from __future__ import annotations

from kvstore.hitrate.errors import TraceError
from kvstore.hitrate.readers.container import Container, container_of, read_head

_PEEK_BYTES = 1 << 16


def table_columns(path: str) -> list[str]:
    """Column names of a Parquet or Arrow file."""
    # imported here: sniffing a JSON trace never pays for pyarrow
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
    head = read_head(path, _PEEK_BYTES)
    if not head.strip():
        raise TraceError(path, None, "empty file")
    first_line = head.split(b"\n", 1)[0]
    mooncake_keys = b'"hash_ids"' in first_line and b'"timestamp"' in first_line
    if b'"input_length"' in first_line or (mooncake_keys and b'"requests"' not in first_line):
        return "mooncake"
    if b'"requests"' in head or b'"block_size"' in head:
        return "kv-cache-tester"
    raise TraceError(path, "1", "cannot tell the trace format; pass --format")
