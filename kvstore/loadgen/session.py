"""The store a load run talks to, re-opened after an outage.

A daemon that is killed and restarted comes back with no namespaces registered and
without the shared-memory segment the old client mapped, so after ``StoreUnavailable`` the
next call (at most every ``reopen_interval_s``) opens a fresh client and registers every
namespace seen so far again; ``UnknownNamespace`` (a restart between two calls) registers
again and retries once. An embedded store is never re-opened (``reopenable=False``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kvstore.errors import StoreUnavailable, UnknownNamespace
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats

T = TypeVar("T")


class StoreSession:
    def __init__(
        self,
        opener: Callable[[], KVStore],
        *,
        reopenable: bool,
        timeout_s: float = 10.0,
        reopen_interval_s: float = 0.5,
    ) -> None:
        self._opener = opener
        self._reopenable = reopenable
        self.timeout_s = timeout_s
        self._reopen_interval_s = reopen_interval_s
        self._lock = threading.Lock()
        self._store = opener()
        self._epoch = 0
        self._broken_epoch = -1
        self._last_reopen = 0.0
        self._namespaces: dict[bytes, Namespace] = {}
        self._registered: set[tuple[int, bytes]] = set()
        self.reopens = 0
        self._takes_prompt = _takes_prompt_tokens(self._store)

    # -- plumbing -------------------------------------------------------------------
    def _current(self) -> tuple[KVStore, int]:
        with self._lock:
            now = time.monotonic()
            if (
                self._reopenable
                and self._broken_epoch == self._epoch
                and now - self._last_reopen >= self._reopen_interval_s
            ):
                self._last_reopen = now
                old, self._store = self._store, self._opener()
                self._epoch += 1
                self.reopens += 1
                # Closing a client of a dead daemon waits on its own deadline: not here.
                threading.Thread(target=_close_quietly, args=(old,), daemon=True).start()
            return self._store, self._epoch

    def _call(self, ns: Namespace | None, fn: Callable[[KVStore], T]) -> T:
        store, epoch = self._current()
        try:
            if ns is not None:
                self._ensure_registered(store, epoch, ns)
            try:
                return fn(store)
            except UnknownNamespace:
                if ns is None:
                    raise
                store.register(ns, timeout_s=self.timeout_s)  # the daemon restarted
                return fn(store)
        except StoreUnavailable:
            with self._lock:
                self._broken_epoch = max(self._broken_epoch, epoch)
            raise

    def _ensure_registered(self, store: KVStore, epoch: int, ns: Namespace) -> None:
        if (epoch, ns.fingerprint) in self._registered:
            return
        store.register(ns, timeout_s=self.timeout_s)
        with self._lock:
            self._namespaces[ns.fingerprint] = ns
            self._registered.add((epoch, ns.fingerprint))

    # -- the calls a replay makes ---------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        self._call(ns, lambda s: None)

    def namespaces(self) -> list[Namespace]:
        with self._lock:
            return list(self._namespaces.values())

    def lookup(self, ns: Namespace, keys: Sequence[Key], prompt_tokens: int) -> LookupResult:
        t = self.timeout_s
        if self._takes_prompt:
            # The access log records the prompt length, so the log replays to the same L.
            return self._call(
                ns,
                lambda s: s.lookup(ns, keys, timeout_s=t, prompt_tokens=prompt_tokens),  # type: ignore[call-arg]
            )
        return self._call(ns, lambda s: s.lookup(ns, keys, timeout_s=t))

    def get_into(self, ns: Namespace, keys: Sequence[Key], dst: Any) -> int:
        t = self.timeout_s
        return self._call(ns, lambda s: s.get_into(ns, keys, dst, timeout_s=t))

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        durability: Durability,
    ) -> CommitResult:
        t = self.timeout_s
        return self._call(
            ns, lambda s: s.commit(ns, keys, payloads, durability=durability, timeout_s=t)
        )

    def stats(self) -> StoreStats:
        t = self.timeout_s
        return self._call(None, lambda s: s.stats(timeout_s=t))

    def flush(self) -> None:
        t = self.timeout_s
        self._call(None, lambda s: s.flush(timeout_s=t))

    def patiently(self, fn: Callable[[], T], patience_s: float) -> T:
        """``fn()``, retried through an outage of up to ``patience_s``: for the calls that
        must be answered (the audit, the final stats), not for the replay, whose calls
        during an outage are counted misses."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                return fn()
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self._reopen_interval_s)

    def tenant(self) -> str:
        """The tenant the store's token maps to: the namespaces the replay builds carry it
        (a daemon with a token file refuses any other). "" for a store without tokens."""
        store = self._current()[0]
        ask = getattr(store, "tenant", None)
        return str(ask(timeout_s=self.timeout_s)) if callable(ask) else ""

    @property
    def store(self) -> KVStore:
        return self._current()[0]

    def close(self) -> None:
        with self._lock:
            store = self._store
        store.close()


def _takes_prompt_tokens(store: KVStore) -> bool:
    try:
        return "prompt_tokens" in inspect.signature(store.lookup).parameters
    except (TypeError, ValueError):
        return False


def _close_quietly(store: KVStore) -> None:
    # An old client of a dead daemon may fail to close; it is garbage either way.
    with contextlib.suppress(Exception):
        store.close()
