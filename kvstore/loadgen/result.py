"""What a load run measured: hits as the store served them (the simulator's figures, for
real), latencies per call, throughput, wrong bytes and errors by kind."""

from __future__ import annotations

import math
import threading
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstore.errors import IntegrityError
from kvstore.hitrate.config import TIER_NAMES
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.tally import HitTally

CALLS = ("lookup", "get", "commit")
_TIER_INDEX = {name: i for i, name in enumerate(TIER_NAMES)}
MAX_WRONG_KEYS = 20


class LatencySamples:
    """Every latency of one call kind, in seconds (8 bytes each: exact percentiles, and a
    million calls cost 8 MB)."""

    def __init__(self) -> None:
        self._s = array("d")

    def add(self, seconds: float) -> None:
        self._s.append(seconds)

    def __len__(self) -> int:
        return len(self._s)

    def summary(self) -> dict[str, float | int | None]:
        n = len(self._s)
        if n == 0:
            return {"count": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
        a = np.frombuffer(self._s, dtype=np.float64) * 1e3
        p50, p99 = np.percentile(a, [50, 99])
        return {
            "count": n,
            "p50_ms": float(p50),
            "p99_ms": float(p99),
            "mean_ms": float(a.mean()),
            "max_ms": float(a.max()),
        }


@dataclass(frozen=True, slots=True)
class WrongBlock:
    """A block read back with bytes its key does not produce."""

    namespace: str
    key_hex: str
    request: int
    block: int
    wrong_bytes: int
    first_offset: int


class Tally:
    """Thread-safe totals of one run, kept exactly as ``Simulator.step`` keeps them so the
    measured and predicted results are the same kind of object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = HitTally()
        self.replay_keep_tokens = 140
        self.block_tokens = 0
        self.latency = {c: LatencySamples() for c in CALLS}
        self.errors: Counter[str] = Counter()
        self.wrong_bytes = 0
        self.wrong_blocks: list[WrongBlock] = []
        self.wrong_block_count = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.blocks_read = 0
        self.blocks_written = 0
        self.durable_acked_blocks = 0

    def request(self, req: Request, served: int, tiers: tuple[str, ...]) -> int:
        """Account ``req`` with ``served`` blocks read back, ``tiers[i]`` the tier that held
        block ``i``; returns the hit tokens."""
        tok = [0, 0, 0]
        blocks = [0, 0, 0]
        for i in range(served):
            t = _TIER_INDEX.get(tiers[i] if i < len(tiers) else "dram", 1)
            blocks[t] += 1
            tok[t] += req.block_weight(i)
        with self._lock:
            self.block_tokens = self.block_tokens or req.block_tokens
            return self.hits.add(req.input_tokens, blocks, tok, self.replay_keep_tokens)

    @property
    def requests(self) -> int:
        return self.hits.requests

    def latency_of(self, call: str, seconds: float) -> None:
        with self._lock:
            self.latency[call].add(seconds)

    def error(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.errors[kind] += n

    def moved(self, *, read_blocks: int = 0, written_blocks: int = 0, block_bytes: int) -> None:
        with self._lock:
            self.blocks_read += read_blocks
            self.blocks_written += written_blocks
            self.bytes_read += read_blocks * block_bytes
            self.bytes_written += written_blocks * block_bytes

    def wrong(self, block: WrongBlock) -> None:
        with self._lock:
            self.wrong_bytes += block.wrong_bytes
            self.wrong_block_count += 1
            if len(self.wrong_blocks) < MAX_WRONG_KEYS:
                self.wrong_blocks.append(block)

    def acked(self, n: int) -> None:
        with self._lock:
            self.durable_acked_blocks += n

    def measured(self, capacity_blocks: dict[str, float]) -> SimResult:
        """The served figures as a ``SimResult``; ``capacity_blocks`` per present tier."""
        with self._lock:
            return self.hits.result(
                self.block_tokens,
                [capacity_blocks.get(name, 0) for name in TIER_NAMES],
                [name in capacity_blocks for name in TIER_NAMES],
            )

    def check_integrity(self) -> None:
        with self._lock:
            self.hits.check_integrity("loadgen")
            if self.wrong_block_count < len(self.wrong_blocks):
                raise IntegrityError("loadgen: more wrong blocks listed than counted")
            counts = {c: len(s) for c, s in self.latency.items()}
            if counts["lookup"] > self.requests:
                raise IntegrityError("loadgen: more lookups timed than requests replayed")


@dataclass(frozen=True, slots=True)
class Throughput:
    wall_s: float
    requests: int
    bytes_read: int
    bytes_written: int

    def to_dict(self) -> dict[str, float]:
        w = self.wall_s if self.wall_s > 0 else math.nan
        mb = 1e6
        return {
            "wall_s": self.wall_s,
            "requests_per_s": self.requests / w if self.wall_s > 0 else 0.0,
            "read_mb_per_s": self.bytes_read / mb / w if self.wall_s > 0 else 0.0,
            "write_mb_per_s": self.bytes_written / mb / w if self.wall_s > 0 else 0.0,
            "mb_per_s": (self.bytes_read + self.bytes_written) / mb / w if self.wall_s > 0 else 0.0,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }


@dataclass(frozen=True, slots=True)
class LoadReport:
    """Everything ``--json`` prints besides the hitrate-shaped ``measured`` body."""

    measured: dict[str, Any]
    predicted: dict[str, Any]
    throughput: Throughput
    latency: dict[str, dict[str, float | int | None]]
    errors: dict[str, int]
    wrong_bytes: int
    wrong_blocks: int
    wrong_keys: list[WrongBlock]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.measured)
        out["predicted"] = self.predicted
        out["wrong_bytes"] = self.wrong_bytes
        out["wrong_blocks"] = self.wrong_blocks
        out["wrong_keys"] = [
            {
                "namespace": w.namespace,
                "key": w.key_hex,
                "request": w.request,
                "block": w.block,
                "wrong_bytes": w.wrong_bytes,
                "first_offset": w.first_offset,
            }
            for w in self.wrong_keys
        ]
        out["errors"] = dict(sorted(self.errors.items()))
        out["throughput"] = self.throughput.to_dict()
        out["latency"] = self.latency
        out.update(self.extra)
        return out
