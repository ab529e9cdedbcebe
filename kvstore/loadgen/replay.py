"""One request replayed as an engine would (DESIGN §2): ``lookup`` the chain, ``get_into``
the hit prefix, check its bytes, ``commit`` the chain with payloads for the blocks it
"computed" (those after the prefix actually served)."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from kvstore.errors import (
    IntegrityError,
    InvalidArgument,
    KVStoreError,
    StoreUnavailable,
    UnknownNamespace,
)
from kvstore.hitrate.request import Request
from kvstore.keys import Key, Namespace
from kvstore.loadgen.ledger import DurableLedger
from kvstore.loadgen.payload import PayloadMaker
from kvstore.loadgen.result import Tally, WrongBlock
from kvstore.loadgen.session import StoreSession
from kvstore.tier import Durability

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    verify: bool = False
    durability: Durability = "dram"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A trace request with its store identity: ``seq`` is its place in replay order."""

    seq: int
    request: Request
    ns: Namespace
    keys: list[Key]


def error_kind(e: BaseException) -> str:
    """The ``errors`` bucket of an exception: a stable name per kind, not per message."""
    if isinstance(e, StoreUnavailable):
        return "unavailable"
    if isinstance(e, UnknownNamespace):
        return "unknown_namespace"
    if isinstance(e, InvalidArgument):
        return "invalid_argument"
    if isinstance(e, IntegrityError):
        return "integrity"
    if isinstance(e, KVStoreError):
        return type(e).__name__
    return f"internal:{type(e).__name__}"


class Replayer:
    """Callable on one ``TraceRequest``; thread-safe (all shared state is in ``Tally``,
    ``DurableLedger`` and ``StoreSession``, which lock)."""

    def __init__(
        self,
        session: StoreSession,
        payloads: PayloadMaker,
        tally: Tally,
        config: ReplayConfig,
        ledger: DurableLedger | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.session = session
        self.payloads = payloads
        self.tally = tally
        self.config = config
        self.ledger = ledger if ledger is not None else DurableLedger()
        self._stderr = stderr if stderr is not None else sys.stderr
        self._reported_internal = False

    def _fail(self, e: BaseException) -> None:
        kind = error_kind(e)
        self.tally.error(kind)
        if kind.startswith("internal:") and not self._reported_internal:
            self._reported_internal = True
            log.error("loadgen: unexpected error in a store call", exc_info=e)

    def __call__(self, tr: TraceRequest) -> None:
        ns, keys, req = tr.ns, tr.keys, tr.request
        s, tally = self.session, self.tally
        bb = ns.block_bytes
        clock = time.perf_counter
        hit = 0
        tiers: tuple[str, ...] = ()
        t0 = clock()
        try:
            res = s.lookup(ns, keys, req.input_tokens)
            tally.latency_of("lookup", clock() - t0)
            hit, tiers = res.hit_blocks, res.tiers
        except Exception as e:  # a failing store is a miss to an engine: counted, not fatal
            self._fail(e)
        served = 0
        if hit > 0:
            dst = np.empty((hit, bb), dtype=np.uint8)
            t0 = clock()
            try:
                served = s.get_into(ns, keys[:hit], dst)
                tally.latency_of("get", clock() - t0)
            except Exception as e:
                self._fail(e)
            tally.moved(read_blocks=served, block_bytes=bb)
            if self.config.verify and served:
                self._verify(tr, dst[:served])
        tally.request(req, served, tuple(tiers))
        if not keys:
            return
        rows = self.payloads.rows(ns, keys[served:])
        payloads = {served + j: rows[j] for j in range(len(rows))}
        t0 = clock()
        try:
            cres = s.commit(ns, keys, payloads, self.config.durability)
            tally.latency_of("commit", clock() - t0)
        except Exception as e:
            self._fail(e)
            return
        tally.moved(written_blocks=len(payloads), block_bytes=bb)
        if cres.dropped:
            tally.error("dropped_blocks", cres.dropped)
        if self.config.durability == "ssd":
            if cres.durability == "ssd" and not cres.dropped:
                self.ledger.add(ns, keys[served:])
                tally.acked(len(payloads))
            else:
                tally.error("not_durable")

    def _verify(self, tr: TraceRequest, got: np.ndarray) -> None:
        bad = self.payloads.check(tr.ns, tr.keys[: len(got)], got)
        for m in bad:
            w = WrongBlock(
                namespace=tr.ns.model_id,
                key_hex=m.key.hex(),
                request=tr.seq,
                block=m.index,
                wrong_bytes=m.wrong_bytes,
                first_offset=m.first_offset,
            )
            self.tally.wrong(w)
            print(
                f"kvstore loadgen: WRONG BYTES: key {w.key_hex} (namespace {w.namespace}, "
                f"request {w.request}, block {w.block}): {w.wrong_bytes} of "
                f"{tr.ns.block_bytes} bytes differ, first at offset {w.first_offset}",
                file=self._stderr,
                flush=True,
            )
