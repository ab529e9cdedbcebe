"""Blocks the store acknowledged as durable on SSD, and the audit that re-reads them.

A commit answered with ``durability="ssd"`` (and nothing dropped) promises its blocks
survive a crash of the daemon; the audit reads every one of them back after a restart and
checks its bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from kvstore.errors import IntegrityError
from kvstore.keys import Key, Namespace
from kvstore.loadgen.payload import PayloadMaker
from kvstore.loadgen.session import StoreSession

_BATCH_BLOCKS = 256


@dataclass(frozen=True, slots=True)
class AuditResult:
    checked: int
    missing: int
    wrong_bytes: int
    missing_keys: tuple[str, ...] = field(default_factory=tuple)  # hex, the first few

    def to_dict(self) -> dict[str, object]:
        return {
            "checked": self.checked,
            "missing": self.missing,
            "wrong_bytes": self.wrong_bytes,
            "missing_keys": list(self.missing_keys),
        }


class DurableLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[bytes, tuple[Namespace, dict[Key, None]]] = {}

    def add(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._lock:
            entry = self._keys.setdefault(ns.fingerprint, (ns, {}))
            entry[1].update(dict.fromkeys(keys))

    def __len__(self) -> int:
        with self._lock:
            return sum(len(k) for _, k in self._keys.values())

    def snapshot(self) -> list[tuple[Namespace, list[Key]]]:
        with self._lock:
            return [(ns, list(keys)) for ns, keys in self._keys.values()]

    def audit(
        self, session: StoreSession, payloads: PayloadMaker, patience_s: float = 60.0
    ) -> AuditResult:
        """Read every acknowledged block back. Keys are independent blocks to the store, so
        a batch is looked up as one list and each gap (a missing key) is stepped over. A
        store that is down (restarting) is waited for, up to ``patience_s`` per batch: an
        outage is not a lost block."""
        checked = missing = wrong = 0
        missing_keys: list[str] = []
        for ns, keys in self.snapshot():
            bb = ns.block_bytes
            pos = 0
            while pos < len(keys):
                batch = keys[pos : pos + _BATCH_BLOCKS]
                dst = np.empty((len(batch), bb), dtype=np.uint8)
                got = session.patiently(partial(session.get_into, ns, batch, dst), patience_s)
                checked += got
                wrong += sum(m.wrong_bytes for m in payloads.check(ns, batch[:got], dst[:got]))
                if got < len(batch):
                    missing += 1
                    if len(missing_keys) < 20:
                        missing_keys.append(batch[got].hex())
                    checked += 1
                    got += 1  # step over the missing key
                pos += got
        return AuditResult(checked, missing, wrong, tuple(missing_keys))

    def check_integrity(self) -> None:
        with self._lock:
            for fp, (ns, _) in self._keys.items():
                if ns.fingerprint != fp:
                    raise IntegrityError("ledger: namespace filed under another fingerprint")
