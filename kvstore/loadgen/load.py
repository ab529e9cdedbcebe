"""One load run: read the trace, replay it over the streams, predict, report."""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO

from kvstore.hitrate.readers import TraceReader, open_inputs
from kvstore.hitrate.report import Prices, to_json
from kvstore.hitrate.request import Request
from kvstore.loadgen.errors import LoadgenError
from kvstore.loadgen.keymap import MAX_BLOCK_BYTES, KeyMapper
from kvstore.loadgen.ledger import AuditResult, DurableLedger
from kvstore.loadgen.payload import PayloadMaker
from kvstore.loadgen.predict import capacities_from_stats, predict
from kvstore.loadgen.replay import ReplayConfig, Replayer, TraceRequest
from kvstore.loadgen.result import LoadReport, Tally, Throughput
from kvstore.loadgen.session import StoreSession
from kvstore.loadgen.streams import make_dispatcher

#: How long the calls that must be answered after the replay (the audit, the final stats)
#: wait for a store that is down: a daemon restart is an outage, not a verdict.
OUTAGE_PATIENCE_S = 60.0
#: Concurrent streams are threads; past this the machine, not the store, is measured.
MAX_CONCURRENCY = 1024


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """``max_requests`` replays the first N requests (a slice of the trace, in replay
    order); ``streams`` is ``auto``, ``pool`` or ``namespace`` (see ``streams.py``)."""

    inputs: tuple[str, ...]
    fmt: str = "auto"
    block_tokens: int | None = None
    bytes_per_token: int = 32
    concurrency: int = 1
    speed: float = math.inf
    streams: str = "auto"
    verify: bool = False
    durability: str = "dram"
    max_requests: int | None = None
    audit: bool = False
    tenant: str = ""

    def __post_init__(self) -> None:
        if self.durability not in ("dram", "ssd"):
            raise LoadgenError(f"--durability must be dram or ssd, got {self.durability!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise LoadgenError(f"--requests must be >= 1, got {self.max_requests}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise LoadgenError(
                f"--concurrency must be in [1, {MAX_CONCURRENCY}], got {self.concurrency}"
            )
        if self.bytes_per_token > MAX_BLOCK_BYTES:
            raise LoadgenError(
                f"--bytes-per-token {self.bytes_per_token} makes blocks over "
                f"{MAX_BLOCK_BYTES >> 20} MiB"
            )
        if not self.speed > 0:
            raise LoadgenError(f"--speed must be positive (inf: unpaced), got {self.speed}")


def tagged_requests(reader: TraceReader) -> Iterator[tuple[int, Request]]:
    """``reader.requests()`` with each request's file index: the same merge (stable, by
    time, ties in file order), so the order is exactly the simulator's."""
    if len(reader.paths) == 1:
        return ((0, r) for r in reader.file_requests(0, reader.paths[0]))
    per_file = [_tag(i, reader.file_requests(i, p)) for i, p in enumerate(reader.paths)]
    return heapq.merge(*per_file, key=lambda t: t[1].time_s)


def _tag(index: int, requests: Iterator[Request]) -> Iterator[tuple[int, Request]]:
    # A function, not a generator expression, so each file keeps its own index.
    for r in requests:
        yield index, r


class LoadRun:
    def __init__(
        self,
        config: LoadConfig,
        session: StoreSession,
        *,
        ledger: DurableLedger | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.config = config
        self.session = session
        self.reader = open_inputs(config.inputs, fmt=config.fmt, block_tokens=config.block_tokens)
        self.mapper = KeyMapper(
            self.reader.format, self.reader.paths, config.bytes_per_token, config.tenant
        )
        self.payloads = PayloadMaker()
        self.tally = Tally()
        self.ledger = ledger if ledger is not None else DurableLedger()
        self.replayer = Replayer(
            session,
            self.payloads,
            self.tally,
            ReplayConfig(verify=config.verify, durability=config.durability),  # type: ignore[arg-type]
            self.ledger,
            stderr,
        )
        self.audit_result: AuditResult | None = None

    def items(self) -> Iterator[TraceRequest]:
        tagged = itertools.islice(tagged_requests(self.reader), self.config.max_requests)
        for seq, (index, req) in enumerate(tagged):
            ns = self.mapper.namespace(index, req.block_tokens)
            yield TraceRequest(seq, req, ns, self.mapper.keys(ns, req.keys))

    def streams_mode(self) -> str:
        if self.config.streams != "auto":
            return self.config.streams
        return "namespace" if self.mapper.per_file and self.config.concurrency > 1 else "pool"

    def run(self) -> LoadReport:
        dispatcher = make_dispatcher(
            self.streams_mode(), self.config.concurrency, self.config.speed
        )
        self.session.stats()  # fail fast, before any request, if the store is not there
        t0 = time.perf_counter()
        dispatcher.run(self.items(), self.replayer)
        wall_s = time.perf_counter() - t0
        if self.config.audit:
            self.audit_result = self.ledger.audit(self.session, self.payloads, OUTAGE_PATIENCE_S)
        return self.report(wall_s)

    def report(self, wall_s: float) -> LoadReport:
        tally = self.tally
        tally.check_integrity()
        self.mapper.check_integrity()
        self.ledger.check_integrity()
        namespaces = self.mapper.namespaces()
        if not namespaces or tally.requests == 0:
            raise LoadgenError("the input holds no requests with blocks to replay")
        sizes = {ns.block_bytes for ns in namespaces}
        if len(sizes) > 1:
            raise LoadgenError(f"one block size per run, got {sorted(sizes)} bytes")
        for ns in namespaces:  # a namespace seen only while the store was down
            self.session.patiently(partial(self.session.register, ns), OUTAGE_PATIENCE_S)
        stats = self.session.patiently(self.session.stats, OUTAGE_PATIENCE_S)
        caps = capacities_from_stats(stats, sizes.pop())
        b = namespaces[0].block_tokens
        config = caps.sim_config(b)
        predicted = predict(
            itertools.islice(self.reader.requests(), self.config.max_requests), caps, b
        )
        prices = Prices()
        measured = tally.measured({k: float(v) for k, v in caps.blocks.items()})
        measured_json = to_json(measured, config, prices)
        measured_json["bytes_per_token"] = self.config.bytes_per_token
        predicted_json = to_json(predicted, config, prices)
        predicted_json["bytes_per_token"] = self.config.bytes_per_token
        extra: dict[str, Any] = {
            "gap_points": 100.0 * (measured.token_hit_rate - predicted.token_hit_rate),
            "load": {
                "concurrency": self.config.concurrency,
                "streams": self.streams_mode(),
                "speed": None if math.isinf(self.config.speed) else self.config.speed,
                "verify": self.config.verify,
                "durability": self.config.durability,
                "namespaces": len(namespaces),
                "block_bytes": namespaces[0].block_bytes,
                "blocks_read": tally.blocks_read,
                "blocks_written": tally.blocks_written,
                # Acknowledgements count a block once per commit that carried it; two
                # sessions sharing a prefix may both commit it, so the audit (which reads
                # each block once) is compared with the distinct count.
                "durable_acked_blocks": tally.durable_acked_blocks,
                "durable_distinct_blocks": len(self.ledger),
                "store_reopens": self.session.reopens,
            },
            "store_counters": dict(stats.counters),
        }
        if self.audit_result is not None:
            extra["audit"] = self.audit_result.to_dict()
        return LoadReport(
            measured=measured_json,
            predicted=predicted_json,
            throughput=Throughput(wall_s, tally.requests, tally.bytes_read, tally.bytes_written),
            latency={c: s.summary() for c, s in tally.latency.items()},
            errors=dict(tally.errors),
            wrong_bytes=tally.wrong_bytes,
            wrong_blocks=tally.wrong_block_count,
            wrong_keys=list(tally.wrong_blocks),
            extra=extra,
        )
