"""kv-cache-tester session files (callanjfox/kv-cache-tester).

One JSON document per session: ``block_size``, ``requests[]`` with ``t`` (s from the session
start), ``in``, ``hash_ids`` (``floor(in / block_size)`` full blocks, so the tail never hits)
and, for sub-agent calls, nested ``requests``. DESIGN §10: every file is its own namespace
(``hash_id_scope: local``); all sessions start at time 0 and are merged by time, ties in
file-name order then request order; nested requests are visited parent first.

A session file is one JSON document, so each is parsed whole; sessions are small (MBs) and
only one file's requests are kept per file in the merge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kvstore.hitrate.errors import ConfigError, TraceError
from kvstore.hitrate.readers import fields
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.request import Request

_MAX_DEPTH = 64


class KvCacheTesterReader(TraceReader):
    format = "kv-cache-tester"

    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        # Scope ids to the file without tuples: id * files + index is injective for integer
        # ids, and int keys keep the simulator's dict lookups fast.
        stride = len(self.paths)
        reqs = self._flatten(path, self._load(path))
        reqs.sort(key=lambda r: r[0])  # stable: equal times keep parent-first file order
        for t, big_l, ids, b in reqs:
            yield Request(t, big_l, [i * stride + index for i in ids], b)

    def _load(self, path: str) -> Any:
        try:
            with open(path, "rb") as f:
                return json.loads(f.read().decode("utf-8"))
        except json.JSONDecodeError as e:
            raise TraceError(
                path, str(e.lineno), f"invalid JSON: {e.msg} (column {e.colno})"
            ) from None
        except UnicodeDecodeError as e:
            raise TraceError(path, None, f"not UTF-8 text: {e.reason}") from None
        except OSError as e:
            raise TraceError(path, None, f"cannot open: {e.strerror}") from None
        except RecursionError:
            raise TraceError(path, None, "JSON nested too deeply") from None

    def _flatten(self, path: str, doc: Any) -> list[tuple[float, int, list[int], int]]:
        if not isinstance(doc, dict):
            raise TraceError(path, None, f"expected a JSON object, got {type(doc).__name__}")
        try:
            b = fields.count(fields.get(doc, "block_size"), "block_size")
            if b == 0:
                raise fields.BadField("block_size must be positive")
            top = fields.get(doc, "requests")
        except fields.BadField as e:
            raise TraceError(path, None, str(e)) from None
        if self.block_tokens is not None and self.block_tokens != b:
            raise ConfigError(
                f"{path}: block_size is {b} but --block-tokens says {self.block_tokens}"
            )
        out: list[tuple[float, int, list[int], int]] = []
        self._visit(path, top, "requests", None, b, out, 0)
        return out

    def _visit(
        self,
        path: str,
        entries: Any,
        where: str,
        parent_t: float | None,
        b: int,
        out: list[tuple[float, int, list[int], int]],
        depth: int,
    ) -> None:
        if type(entries) is not list:
            raise TraceError(path, where, "must be a list of requests")
        if depth > _MAX_DEPTH:
            raise TraceError(path, where, f"requests nested deeper than {_MAX_DEPTH}")
        for i, r in enumerate(entries):
            here = f"{where}[{i}]"
            try:
                if not isinstance(r, dict):
                    raise fields.BadField(f"expected an object, got {type(r).__name__}")
                if "t" in r:
                    t = fields.time_value(r["t"], "t")
                elif parent_t is not None:
                    t = parent_t  # a nested call without its own time starts with its parent
                else:
                    raise fields.BadField("missing field 't'")
                nested = r.get("requests")
                if "hash_ids" in r or nested is None:
                    big_l = fields.count(fields.get(r, "in"), "in")
                    ids = fields.id_list(fields.get(r, "hash_ids"), "hash_ids")
                    out.append((t, big_l, ids, b))
            except fields.BadField as e:
                raise TraceError(path, here, str(e)) from None
            if nested is not None:
                self._visit(path, nested, f"{here}.requests", t, b, out, depth + 1)
