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

import heapq
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from kvstore.hitrate.batches import AccessBatch, Row, batches_of, scope_ids
from kvstore.hitrate.errors import ConfigError, TraceError
from kvstore.hitrate.readers import fields
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.request import Request

_MAX_DEPTH = 64
_MARK = "\u0000"  # split_hash_ids' stand-in for a list of ids: {"\u0000": index}
DENSE_KEYS = 1 << 31  # the native stack indexes keys below this directly (no hashing)


@dataclass(frozen=True, slots=True)
class _Session:
    """One session's requests, each held as its difference from the one before it in the
    file: a session re-sends its context, so the new blocks are a small part and a merge
    of many sessions holds about their distinct ids, not every access."""

    deltas: list[tuple[float, int, int, np.ndarray, int]]  # (t, L, shared prefix, rest, B)
    lo: int
    hi: int
    accesses: int

    @staticmethod
    def of(reqs: list[tuple[float, int, np.ndarray, int]]) -> _Session:
        deltas = []
        prev = np.empty(0, dtype=np.int64)
        lo, hi, accesses = 0, -1, 0
        for t, big_l, a, b in reqs:
            n = min(len(prev), len(a))
            same = prev[:n] == a[:n]
            p = n if same.all() else int(same.argmin())
            rest = a[p:].copy()
            if len(rest):
                lo, hi = min(lo, int(rest.min())), max(hi, int(rest.max()))
            deltas.append((t, big_l, p, rest, b))
            accesses += len(a)
            prev = a
        return _Session(deltas, lo, hi, accesses)

    def rows(self, base: int, index: int) -> Iterator[Row]:
        """Rows with ids as ``base + id`` (dense), or hashed with ``index`` if base < 0."""
        keys = np.empty(0, dtype=np.uint64)
        for t, big_l, p, rest, b in self.deltas:
            new = rest.astype(np.uint64) + np.uint64(base) if base >= 0 else scope_ids(rest, index)
            keys = np.concatenate((keys[:p], new)) if p else new
            yield t, big_l, keys, b


class KvCacheTesterReader(TraceReader):
    format = "kv-cache-tester"

    def file_rows(self, index: int, path: str) -> Iterator[Row]:
        """The file's requests as ``(t, L, uint64 keys, B)``; see ``batches``."""
        session = self._prepare(path)
        self.total_accesses = session.accesses
        return session.rows(0, index)

    def batches(self) -> Iterator[AccessBatch]:
        """Sessions are loaded two at a time (the ids are split out of the JSON without the
        GIL), then merged by time. Ids become dense run-wide keys (``base + id``, the base
        counting every earlier file's ids) when they fit, else they are hashed with the
        file (``scope_ids``)."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            sessions = list(pool.map(self._prepare, self.paths))
        self.total_accesses = sum(s.accesses for s in sessions)
        streams = []
        base = 0
        for index, session in enumerate(sessions):
            dense = session.lo >= 0 and base + session.hi + 1 <= DENSE_KEYS
            streams.append(session.rows(base if dense else -1, index))
            if dense:
                base += session.hi + 1
        if len(streams) == 1:
            return batches_of(streams[0])
        return batches_of(heapq.merge(*streams, key=itemgetter(0)))

    def _prepare(self, path: str) -> _Session:
        doc, ids, offsets = self._load_split(path)
        reqs = self._flatten(path, doc, lambda v, name: self._id_array(v, name, ids, offsets))
        reqs.sort(key=lambda r: r[0])  # stable: equal times keep parent-first file order
        self.bytes_done += os.path.getsize(path)
        return _Session.of(reqs)

    def _load_split(self, path: str) -> tuple[Any, np.ndarray, np.ndarray]:
        from kvstore.hitrate.onepass import native

        raw = self._read(path)
        skeleton, ids, offsets = native().split_hash_ids(raw)
        try:
            doc = json.loads(skeleton.decode("utf-8"))
        except (ValueError, RecursionError):
            self._parse(path, raw)  # the error as the whole file shows it (line numbers)
            raise
        return doc, np.frombuffer(ids, dtype=np.int64), np.frombuffer(offsets, dtype=np.int64)

    @staticmethod
    def _id_array(value: Any, name: str, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        if type(value) is dict and len(value) == 1 and type(value.get(_MARK)) is int:
            i = value[_MARK]
            return ids[offsets[i] : offsets[i + 1]]
        checked = fields.id_list(value, name)  # a short list, or one json must judge
        try:
            return np.array(checked, dtype=np.int64)
        except OverflowError:
            return np.array([hash(x) for x in checked], dtype=np.int64)  # beyond 64 bits

    def file_requests(self, index: int, path: str) -> Iterator[Request]:
        # Scope ids to the file without tuples: id * files + index is injective for integer
        # ids, and int keys keep the simulator's dict lookups fast.
        stride = len(self.paths)
        reqs = self._flatten(path, self._load(path))
        reqs.sort(key=lambda r: r[0])  # stable: equal times keep parent-first file order
        # The file is the session (sub-agent calls included): its name, not its index, so a
        # router hashes it the same whatever other files the run reads.
        session = os.path.basename(path)
        for t, big_l, ids, b in reqs:
            yield Request(t, big_l, [i * stride + index for i in ids], b, session)

    def _load(self, path: str) -> Any:
        return self._parse(path, self._read(path))

    @staticmethod
    def _read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise TraceError(path, None, f"cannot open: {e.strerror}") from None

    @staticmethod
    def _parse(path: str, raw: bytes) -> Any:
        try:
            return json.loads(raw.decode("utf-8"))
        except json.JSONDecodeError as e:
            raise TraceError(
                path, str(e.lineno), f"invalid JSON: {e.msg} (column {e.colno})"
            ) from None
        except UnicodeDecodeError as e:
            raise TraceError(path, None, f"not UTF-8 text: {e.reason}") from None
        except RecursionError:
            raise TraceError(path, None, "JSON nested too deeply") from None

    def _flatten(
        self, path: str, doc: Any, id_list: Callable[[Any, str], Any] = fields.id_list
    ) -> list[tuple[float, int, Any, int]]:
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
        out: list[tuple[float, int, Any, int]] = []
        self._visit(path, top, "requests", None, b, out, 0, id_list)
        return out

    def _visit(
        self,
        path: str,
        entries: Any,
        where: str,
        parent_t: float | None,
        b: int,
        out: list[tuple[float, int, Any, int]],
        depth: int,
        id_list: Callable[[Any, str], Any],
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
                    ids = id_list(fields.get(r, "hash_ids"), "hash_ids")
                    out.append((t, big_l, ids, b))
            except fields.BadField as e:
                raise TraceError(path, here, str(e)) from None
            if nested is not None:
                self._visit(path, nested, f"{here}.requests", t, b, out, depth + 1, id_list)
