"""The daemon's Parquet access log (DESIGN §8): one row per ``Lookup``.

Block identity is the 16-byte chain key itself: keys are derived from the namespace
fingerprint (DESIGN §3), so equal keys in two namespaces cannot happen. ``prompt_tokens``
of 0 (unknown) counts the chain's full blocks: ``L = len(keys) × block_tokens``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA, KEY_BYTES
from kvstore.hitrate.batches import Row, fold_key16
from kvstore.hitrate.errors import ConfigError, TraceError
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.readers.columnar import open_table_batches, table_schema
from kvstore.hitrate.request import Request

_COLUMNS = ("ts_us", "block_tokens", "prompt_tokens", "keys")


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    # List item names differ between writers ("item", "element"); the item type is what counts.
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    return a.equals(b)


def check_schema(path: str, schema: pa.Schema) -> None:
    """Every DESIGN §8 field present with its exact type (nullability aside)."""
    for want in ACCESS_LOG_SCHEMA:
        if want.name not in schema.names:
            raise TraceError(path, None, f"not an access log: missing column {want.name!r}")
        got = schema.field(want.name).type
        if not _same_type(got, want.type):
            raise TraceError(
                path, None, f"column {want.name!r} has type {got}, the access log needs {want.type}"
            )


def _row_count(path: str) -> int:
    from kvstore.hitrate.readers.container import Container, container_of

    if container_of(path) is Container.PARQUET:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return 0  # Arrow IPC: the progress bar extrapolates from bytes only when it can


class AccessLogReader(TraceReader):
    format = "access-log"

    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        check_schema(path, table_schema(path))
        row = 0
        for batch in open_table_batches(path, _COLUMNS):
            self._check_batch(path, batch, row)
            ts = batch.column("ts_us").to_pylist()
            bt = batch.column("block_tokens").to_pylist()
            pt = batch.column("prompt_tokens").to_pylist()
            keys = batch.column("keys").to_pylist()
            for t, b, p, k in zip(ts, bt, pt, keys, strict=True):
                row += 1
                if self.block_tokens is not None and b != self.block_tokens:
                    raise ConfigError(
                        f"{path}: row {row} has block_tokens {b} but --block-tokens says "
                        f"{self.block_tokens}"
                    )
                yield Request(t / 1e6, p if p > 0 else len(k) * b, k, b)

    def file_rows(self, index: int, path: str) -> Iterator[Row]:
        """As ``file_requests``, the keys folded to 64 bits a record batch at a time."""
        check_schema(path, table_schema(path))
        row = 0
        size = os.path.getsize(path)
        rows_total = max(1, _row_count(path))
        for batch in open_table_batches(path, _COLUMNS):
            self._check_batch(path, batch, row)
            keys = batch.column("keys")
            offsets = np.asarray(keys.offsets)  # into the flattened keys
            flat = pc.list_flatten(keys)
            raw = np.frombuffer(flat.buffers()[1], dtype=np.uint8)
            start = flat.offset * KEY_BYTES
            folded = fold_key16(raw[start : start + len(flat) * KEY_BYTES])
            base = offsets[0]
            ts = batch.column("ts_us").to_numpy() / 1e6
            bt = batch.column("block_tokens").to_pylist()
            pt = batch.column("prompt_tokens").to_pylist()
            for i, (b, p) in enumerate(zip(bt, pt, strict=True)):
                row += 1
                if self.block_tokens is not None and b != self.block_tokens:
                    raise ConfigError(
                        f"{path}: row {row} has block_tokens {b} but --block-tokens says "
                        f"{self.block_tokens}"
                    )
                k = folded[offsets[i] - base : offsets[i + 1] - base]
                yield float(ts[i]), p if p > 0 else len(k) * b, k, b
            self.bytes_done += size * batch.num_rows // rows_total

    @staticmethod
    def _check_batch(path: str, batch: pa.RecordBatch, first_row: int) -> None:
        """Vectorised checks; on failure, find the first bad row for the message."""

        def fail(mask: pa.Array, message: str) -> None:
            bad = pc.index(mask, True).as_py()
            raise TraceError(path, f"row {first_row + bad + 1}", message)

        for name in _COLUMNS:
            col = batch.column(name)
            if col.null_count:
                fail(pc.is_null(col), f"null {name}")
        if pc.any(pc.less(batch.column("ts_us"), 0)).as_py():
            fail(pc.less(batch.column("ts_us"), 0), "negative ts_us")
        if pc.any(pc.less_equal(batch.column("block_tokens"), 0)).as_py():
            fail(pc.less_equal(batch.column("block_tokens"), 0), "block_tokens must be positive")
        if pc.any(pc.less(batch.column("prompt_tokens"), 0)).as_py():
            fail(pc.less(batch.column("prompt_tokens"), 0), "negative prompt_tokens")
        keys = batch.column("keys")
        flat = pc.list_flatten(keys)
        if flat.null_count:
            per_row = pc.list_value_length(keys)  # locate the row holding the null key
            offsets = pc.cumulative_sum(per_row).to_pylist()
            first_null = pc.index(pc.is_null(flat), True).as_py()
            bad = next(i for i, end in enumerate(offsets) if end > first_null)
            raise TraceError(path, f"row {first_row + bad + 1}", "null key in keys")
        if not pa.types.is_fixed_size_binary(flat.type) or flat.type.byte_width != KEY_BYTES:
            raise TraceError(path, None, f"keys must be binary({KEY_BYTES})")
