"""``TierStats`` for an SSD directory: capacity in blocks per size class, counters, and
what the I/O path really is (backend, O_DIRECT or buffered)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping

from kvstore.tier import SizeClassStats, TierStats
from storage_nodes.ssd.config import SSDConfig, slot_bytes_for
from storage_nodes.ssd.index import Index
from storage_nodes.ssd.slabs import SlabFiles

COUNTERS = (
    "puts",
    "gets",
    "hits",
    "misses",
    "inserted",
    "dropped",
    "evictions",
    "retention_violations_total",
    "corrupt_blocks_total",
    "expired_total",
    "io_errors_total",
    "read_races",
    "slab_handovers",
    "recoveries",
)


class Counters:
    """The tier's counters, safe to bump from any thread (every one present from 0)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self._lock = threading.Lock()

    def add(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            c = self._counts
            for k, v in counts.items():  # not Counter.update: its ABC check is slow
                c[k] += v

    def inc(self, name: str, n: int = 1) -> int:
        with self._lock:
            self._counts[name] += n
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def build_stats(
    config: SSDConfig,
    index: Index,
    files: SlabFiles,
    backend: str,
    mode: str,
    registered: Iterable[int],
    counters: Mapping[str, int],
) -> TierStats:
    with index.begin() as txn:
        table = index.slab_table(txn)
        quarantined = int(txn.stat(index.quar)["entries"])
        entries = index.count(txn)
    free_chunks = config.chunks - len(table)
    classes = []
    used_bytes = 0
    for bb in sorted(set(registered) | {i.block_bytes for i in table.values()}):
        mine = [i for i in table.values() if i.block_bytes == bb]
        per_slab = config.slab_bytes // slot_bytes_for(bb)
        used = sum(i.used for i in mine)
        used_bytes += used * slot_bytes_for(bb)  # what the blocks occupy on disk
        classes.append(SizeClassStats(bb, (len(mine) + free_chunks) * per_slab, used))
    out = dict(counters)
    out.update(
        degraded=int(mode != "ok"), quarantined_slots=quarantined, blocks=entries, slabs=len(table)
    )
    if files.direct:
        durability = "O_DIRECT + fdatasync"
    else:
        durability = "buffered I/O + fdatasync"
        if files.direct_refused:
            durability += " (O_DIRECT refused by the file system)"
    info = {
        "dir": str(config.dir),
        "io_backend": backend,
        "direct_io": "on" if files.direct else "off",
        "durability": durability,
        "mode": mode,
        "queue_depth": str(config.queue_depth),
        "retention_s": str(config.retention_s),
        "index_durability": config.index_durability,
        "data_sync": "per_put" if config.sync_per_put else "behind",
    }
    return TierStats("ssd", config.capacity_bytes, used_bytes, tuple(classes), out, info)
