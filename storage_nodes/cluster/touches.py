"""Batched touches to every replica (DESIGN §6: recency is coarse and batched).

A ``get_into`` served by one replica must also refresh the others, or retention would
silently expire them and turn R=2 into R=1. Touches are queued per node and sent as
one ``Touch`` per (node, namespace) every ``flush_s``, when a queue grows past
``max_keys``, and before any put (a put may make a node evict, and its choice must
see every touch that came before it).

Order: each queued call is a chain slice to apply last→first, and later calls are
more recent. Sending the calls newest-first, concatenated, makes the node's single
last→first pass touch the oldest call first and the newest call last, which is the
order they happened in.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from kvstore.errors import IntegrityError
from kvstore.keys import Key, Namespace

log = logging.getLogger(__name__)

SendTouch = Callable[[int, Namespace, list[Key]], bool]


class TouchBatcher:
    def __init__(self, n_nodes: int, send: SendTouch, flush_s: float, max_keys: int) -> None:
        self._send = send
        self._max_keys = max_keys
        self._pending: list[list[tuple[Namespace, list[Key]]]] = [[] for _ in range(n_nodes)]
        self._pending_keys = [0] * n_nodes
        self._locks = [threading.Lock() for _ in range(n_nodes)]  # serializes sends per node
        self._qlock = threading.Lock()
        self.counters: Counter[str] = Counter(touch_batches=0, touch_keys=0, touch_failures=0)
        self._stop = threading.Event()
        self._flush_s = flush_s
        self._thread = threading.Thread(
            target=self._run, name="kvstore-cluster-touches", daemon=True
        )
        self._thread.start()

    def add(self, node: int, ns: Namespace, keys: Sequence[Key]) -> None:
        if not keys:
            return
        with self._qlock:
            self._pending[node].append((ns, list(keys)))
            self._pending_keys[node] += len(keys)
            full = self._pending_keys[node] >= self._max_keys
        if full:
            self.flush(node)

    def flush(self, node: int) -> None:
        """Send ``node``'s queued touches now (no-op when none are queued)."""
        if not self._pending_keys[node]:
            return
        with self._locks[node]:
            with self._qlock:
                calls = self._pending[node]
                self._pending[node] = []
                self._pending_keys[node] = 0
            if not calls:
                return
            per_ns: dict[bytes, tuple[Namespace, list[Key]]] = {}
            for ns, keys in reversed(calls):  # newest call first: see the module docstring
                per_ns.setdefault(ns.fingerprint, (ns, []))[1].extend(keys)
            for ns, keys in per_ns.values():
                ok = self._send(node, ns, keys)
                with self._qlock:
                    self.counters["touch_batches"] += 1
                    self.counters["touch_keys" if ok else "touch_failures"] += len(keys)

    def flush_all(self) -> None:
        for node in range(len(self._pending)):
            self.flush(node)

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            try:
                self.flush_all()
            except Exception:  # the flusher must outlive any one failure
                log.exception("touch flush failed")

    def pending_keys(self) -> int:
        with self._qlock:
            return sum(self._pending_keys)

    def check_integrity(self) -> None:
        with self._qlock:
            for node, calls in enumerate(self._pending):
                if sum(len(k) for _, k in calls) != self._pending_keys[node]:
                    raise IntegrityError(f"touch queue of node {node}: key count out of sync")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush_all()
