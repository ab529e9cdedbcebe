"""Mooncake traces (FAST'25 release): JSONL, or Parquet/Arrow with the same columns.

One object per line: ``timestamp`` (ms), ``input_length``, ``hash_ids`` (one id per
``B``-token block, ``ceil(L/B)`` of them, the last partial); ``B`` is 512 unless
``--block-tokens`` says otherwise. All Mooncake inputs of a run share one namespace
(DESIGN §10), so equal ids in two files are the same block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from kvstore.hitrate.batches import Row, encode_int_ids
from kvstore.hitrate.errors import TraceError
from kvstore.hitrate.readers import fields
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.readers.sniff import Container, container_of
from kvstore.hitrate.request import Request

MOONCAKE_BLOCK_TOKENS = 512
COLUMNS = ("timestamp", "input_length", "hash_ids")


def _record(obj: object) -> tuple[float, int, list[int]]:
    if not isinstance(obj, dict):
        raise fields.BadField(f"expected a JSON object, got {type(obj).__name__}")
    ts = fields.time_value(fields.get(obj, "timestamp"), "timestamp")
    big_l = fields.count(fields.get(obj, "input_length"), "input_length")
    ids = fields.id_list(fields.get(obj, "hash_ids"), "hash_ids")
    return ts / 1000.0, big_l, ids


class _InOrder:
    """A trace's requests must come in time order (files are merged by time, which needs
    each file sorted): a timestamp below the one before it is a malformed trace."""

    def __init__(self) -> None:
        self.last = -1.0

    def check(self, t_s: float) -> None:
        if t_s < self.last:
            raise fields.BadField(
                f"timestamp {t_s * 1000:g} ms is before the previous request's "
                f"{self.last * 1000:g} ms; a trace must be in time order"
            )
        self.last = t_s


class MooncakeReader(TraceReader):
    format = "mooncake"

    def _b(self) -> int:
        return self.block_tokens or MOONCAKE_BLOCK_TOKENS

    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        b = self._b()
        for t, big_l, ids in self._records(path):
            yield Request(t, big_l, ids, b)

    def file_rows(self, index: int, path: str) -> Iterator[Row]:
        b = self._b()
        for t, big_l, ids in self._records(path):
            yield t, big_l, encode_int_ids(ids), b

    def _records(self, path: str) -> Iterator[tuple[float, int, list[int]]]:
        if container_of(path) is Container.JSON:
            return self._jsonl(path)
        return self._table(path)

    def _jsonl(self, path: str) -> Iterator[tuple[float, int, list[int]]]:
        loads = json.loads
        order = _InOrder()
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator's with
        except OSError as e:
            raise TraceError(path, None, f"cannot open: {e.strerror}") from None
        with f:
            for lineno, line in enumerate(f, 1):
                self.bytes_done += len(line)
                if not line.strip():
                    continue
                try:
                    rec = _record(loads(line.decode("utf-8")))
                    order.check(rec[0])
                except UnicodeDecodeError as e:
                    raise TraceError(path, str(lineno), f"not UTF-8 text: {e.reason}") from None
                except json.JSONDecodeError as e:
                    raise TraceError(path, str(lineno), f"invalid JSON: {e.msg}") from None
                except RecursionError:
                    raise TraceError(path, str(lineno), "JSON nested too deeply") from None
                except fields.BadField as e:
                    raise TraceError(path, str(lineno), str(e)) from None
                yield rec

    def _table(self, path: str) -> Iterator[tuple[float, int, list[int]]]:
        from kvstore.hitrate.readers.columnar import iter_rows, open_table_batches

        order = _InOrder()
        for row, (ts, big_l, ids) in iter_rows(path, open_table_batches(path, COLUMNS), COLUMNS):
            try:
                if ts is None or big_l is None or ids is None:
                    raise fields.BadField("null in timestamp, input_length or hash_ids")
                t = fields.time_value(ts, "timestamp") / 1000.0
                order.check(t)
                rec = (t, fields.count(big_l, "input_length"), fields.id_list(ids, "hash_ids"))
            except fields.BadField as e:
                raise TraceError(path, f"row {row}", str(e)) from None
            yield rec
