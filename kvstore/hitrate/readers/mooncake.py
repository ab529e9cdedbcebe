"""Mooncake traces (FAST'25 release): JSONL, or Parquet/Arrow with the same columns.

One object per line: ``timestamp`` (ms), ``input_length``, ``hash_ids`` (one id per
``B``-token block, ``ceil(L/B)`` of them, the last partial); ``B`` is 512 unless
``--block-tokens`` says otherwise. All Mooncake inputs of a run share one namespace
(DESIGN §10), so equal ids in two files are the same block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from kvstore.hitrate.errors import TraceError
from kvstore.hitrate.readers import fields
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.readers.sniff import Container, container_of
from kvstore.hitrate.request import Request

MOONCAKE_BLOCK_TOKENS = 512
COLUMNS = ("timestamp", "input_length", "hash_ids")


def _request(obj: object, block_tokens: int) -> Request:
    if not isinstance(obj, dict):
        raise fields.BadField(f"expected a JSON object, got {type(obj).__name__}")
    ts = fields.time_value(fields.get(obj, "timestamp"), "timestamp")
    big_l = fields.count(fields.get(obj, "input_length"), "input_length")
    ids = fields.id_list(fields.get(obj, "hash_ids"), "hash_ids")
    return Request(ts / 1000.0, big_l, ids, block_tokens)


class MooncakeReader(TraceReader):
    format = "mooncake"

    def _b(self) -> int:
        return self.block_tokens or MOONCAKE_BLOCK_TOKENS

    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        if container_of(path) is Container.JSON:
            return self._jsonl(path)
        return self._table(path)

    def _jsonl(self, path: str) -> Iterator[Request]:
        b = self._b()
        loads = json.loads
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator's with
        except OSError as e:
            raise TraceError(path, None, f"cannot open: {e.strerror}") from None
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    req = _request(loads(line.decode("utf-8")), b)
                except UnicodeDecodeError as e:
                    raise TraceError(path, str(lineno), f"not UTF-8 text: {e.reason}") from None
                except json.JSONDecodeError as e:
                    raise TraceError(path, str(lineno), f"invalid JSON: {e.msg}") from None
                except RecursionError:
                    raise TraceError(path, str(lineno), "JSON nested too deeply") from None
                except fields.BadField as e:
                    raise TraceError(path, str(lineno), str(e)) from None
                yield req

    def _table(self, path: str) -> Iterator[Request]:
        from kvstore.hitrate.readers.columnar import iter_rows, open_table_batches

        b = self._b()
        for row, (ts, big_l, ids) in iter_rows(path, open_table_batches(path, COLUMNS), COLUMNS):
            try:
                if ts is None or big_l is None or ids is None:
                    raise fields.BadField("null in timestamp, input_length or hash_ids")
                req = Request(
                    fields.time_value(ts, "timestamp") / 1000.0,
                    fields.count(big_l, "input_length"),
                    fields.id_list(ids, "hash_ids"),
                    b,
                )
            except fields.BadField as e:
                raise TraceError(path, f"row {row}", str(e)) from None
            yield req
