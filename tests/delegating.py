"""``DelegatingStore``: a ``KVStore`` that forwards every call to a real one.

Tests subclass it to damage bytes at one precise point of a real store's data path (a
flipped byte in a read, a segment written during a commit) — faults a test cannot
produce on demand otherwise — while everything else runs for real.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats


class DelegatingStore(KVStore):
    def __init__(self, inner: KVStore) -> None:
        self.inner = inner

    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        self.inner.register(ns, timeout_s=timeout_s)

    def lookup(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> LookupResult:
        return self.inner.lookup(ns, keys, timeout_s=timeout_s)

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        return self.inner.get_into(ns, keys, dst, timeout_s=timeout_s, checksums=checksums)

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        return self.inner.commit(ns, keys, payloads, durability=durability, timeout_s=timeout_s)

    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        return self.inner.prefetch(ns, keys, timeout_s=timeout_s)

    def flush(self, *, timeout_s: float | None = None) -> None:
        self.inner.flush(timeout_s=timeout_s)

    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        return self.inner.delete_namespace(ns, timeout_s=timeout_s)

    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        return self.inner.stats(timeout_s=timeout_s)

    def close(self) -> None:
        self.inner.close()
