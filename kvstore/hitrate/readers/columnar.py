"""Streaming access to Parquet and Arrow IPC files, a record batch at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from kvstore.hitrate.errors import TraceError
from kvstore.hitrate.readers.container import Container, container_of

BATCH_ROWS = 16_384


def table_schema(path: str) -> pa.Schema:
    kind = container_of(path)
    try:
        if kind is Container.PARQUET:
            return pq.read_schema(path)
        if kind is Container.ARROW_FILE:
            with pa.memory_map(path) as src:
                return ipc.open_file(src).schema
        if kind is Container.ARROW_STREAM:
            with pa.OSFile(path) as src:
                return ipc.open_stream(src).schema
    except (pa.ArrowException, OSError) as e:
        raise TraceError(path, None, f"unreadable {kind.value} file: {_first_line(e)}") from None
    raise TraceError(path, None, "not a Parquet or Arrow file")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def open_table_batches(path: str, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Record batches of ``columns`` (checked present), read lazily."""
    schema = table_schema(path)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise TraceError(path, None, f"missing column(s) {', '.join(missing)}")
    return _batches(path, list(columns))


def _batches(path: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    kind = container_of(path)
    try:
        if kind is Container.PARQUET:
            pf = pq.ParquetFile(path)
            yield from pf.iter_batches(batch_size=BATCH_ROWS, columns=columns)
        else:
            with pa.OSFile(path) as src:
                reader: Any
                if kind is Container.ARROW_FILE:
                    reader = ipc.open_file(src)
                    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    reader = ipc.open_stream(src)
                    batches = iter(reader)
                for batch in batches:
                    yield batch.select(columns)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(path, None, f"unreadable {kind.value} file: {_first_line(e)}") from None


def iter_rows(
    path: str, batches: Iterator[pa.RecordBatch], columns: Sequence[str]
) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(row number from 1, values)`` over all batches."""
    row = 0
    for batch in batches:
        cols = [batch.column(c).to_pylist() for c in columns]
        for values in zip(*cols, strict=True):
            row += 1
            yield row, values
