"""The connector's counters, reported through vLLM's ``KVConnectorStats``.

The worker side counts (blocks and tokens loaded, load failures, blocks saved and dropped);
vLLM ships each interval's counts to its logger process, which sums them
(``aggregate``) and logs ``reduce()``'s totals. This module imports vLLM.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

COUNTERS = ("loaded_blocks", "loaded_tokens", "load_failed_blocks", "saved_blocks",
            "save_dropped_blocks")


class StatCounters:
    """Counts since the last ``take``; bumped from the load and commit threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()  # since start, never taken

    def add(self, **counts: int) -> None:
        with self._lock:
            self._counts.update(counts)
            self._totals.update(counts)

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {k: self._totals.get(k, 0) for k in COUNTERS}

    def take(self) -> dict[str, int]:
        with self._lock:
            out = {k: v for k, v in self._counts.items() if v}
            self._counts.clear()
        return out


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: int(self.data.get(key, 0)) for key in COUNTERS}

    def is_empty(self) -> bool:
        return not any(self.data.values())

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


def store_errors(counters: dict[str, int]) -> str:
    """The link's failed calls by kind, for a log line ("none" when there were none)."""
    failed = {k.removeprefix("store_errors_"): v for k, v in counters.items()
              if k.startswith("store_errors_") and k != "store_errors_total" and v}
    return ", ".join(f"{k} {v}" for k, v in sorted(failed.items())) or "none"
