"""The engine's side of a KV store: every store failure is a miss, never an engine error.

``StoreLink`` wraps one ``KVStore`` (DESIGN §5) for one namespace. A store that is
unreachable, dies mid-run or returns a corrupt block costs misses: the call returns "nothing
found" (or "nothing stored") and the failure is counted. One warning says the store is down
(the first failed call) and one says it returned a corrupt block: a store that keeps failing
for the rest of a run is still one line, and the count goes in the output.
``NullStoreLink`` is the ``--kv-store none`` null object: it finds nothing and stores
nothing, without ever being asked. Methods are called from the loader's
and the committer's threads; the counters are guarded.

A call may name another namespace than the link's own (``ns=``): a server's requests carry
their tenant and cache salt in it (``engine.kv.request_scope``). Each namespace is
registered with the store before its first use. A link opened while the store could not
say its tenant (``engine.connector.stores``) asks again before each call (``TenantCheck``).
``observe(call, seconds)`` sees the duration of every store call (a server's latency
histograms); by default it does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kvstore.errors import BlockError, KVStoreError, StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, KVStore, LookupResult, StoreStats

log = logging.getLogger("engine.store")
T = TypeVar("T")

#: Reported from the start, at 0 until they move: a reader that misspells one fails
#: instead of reading 0. (``store_errors_<call>`` appear with the first failure of a call.)
COUNTERS = (
    "store_errors_total",
    "corrupt_blocks_total",
    "loaded_blocks_total",
    "loaded_bytes_total",
    "committed_blocks_total",
    "committed_bytes_total",
    "commit_dropped_blocks_total",
    "commit_unsent_blocks_total",  # left out of a commit: its staging was full (back-pressure)
)


def _ignore_call(call: str, seconds: float) -> None:
    pass


class StoreLink(ABC):
    """Store calls that cannot fail: misses are the only bad news."""

    name: str
    ns: Namespace
    # Called with (call, seconds) after every store call; a server sets it.
    observe: Callable[[str, float], None] = staticmethod(_ignore_call)

    @property
    @abstractmethod
    def enabled(self) -> bool:
        """Whether admission should ask this store at all."""

    @abstractmethod
    def lookup(self, keys: Sequence[Key], timeout_s: float,
               ns: Namespace | None = None) -> LookupResult:
        """Longest prefix of ``keys`` (a chain of ``ns``, default the link's) the store
        holds (0 when it cannot say)."""

    @abstractmethod
    def get_into(self, keys: Sequence[Key], dst: Any, timeout_s: float,
                 ns: Namespace | None = None) -> int:
        """Copy the longest present prefix into ``dst`` rows; blocks copied (0 on failure)."""

    @abstractmethod
    def commit(
        self, keys: Sequence[Key], payloads: Mapping[int, Any], timeout_s: float,
        ns: Namespace | None = None,
    ) -> CommitResult:
        """Store the given blocks of the chain ``keys``; a failure stores nothing."""

    @abstractmethod
    def counters(self) -> dict[str, int]:
        """Calls failed and blocks moved, for the output."""

    def stats(self, timeout_s: float = 2.0) -> StoreStats | None:
        return None

    def note_unsent(self, blocks: int) -> None:
        """Count blocks a commit left out under back-pressure (the engine's staging for
        commits was full: the store was slower than the engine). Uncounted by default."""
        return None

    @abstractmethod
    def sibling(self, ns: Namespace) -> StoreLink:
        """A link to the same store for another namespace (exact mode keeps a hybrid
        model's sliding layers apart); closing it leaves the store open."""

    @abstractmethod
    def close(self) -> None:
        """Flush what the store accepted and release it (idempotent)."""


class NullStoreLink(StoreLink):
    name = "none"

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns

    @property
    def enabled(self) -> bool:
        return False

    def lookup(self, keys: Sequence[Key], timeout_s: float,
               ns: Namespace | None = None) -> LookupResult:
        return LookupResult(hit_blocks=0)

    def get_into(self, keys: Sequence[Key], dst: Any, timeout_s: float,
                 ns: Namespace | None = None) -> int:
        return 0

    def commit(
        self, keys: Sequence[Key], payloads: Mapping[int, Any], timeout_s: float,
        ns: Namespace | None = None,
    ) -> CommitResult:
        return CommitResult(dropped=len(payloads))

    def counters(self) -> dict[str, int]:
        return {}

    def sibling(self, ns: Namespace) -> StoreLink:
        return NullStoreLink(ns)

    def close(self) -> None:
        pass


class TenantCheck:
    """The tenant question for a store that could not answer it when the engine's
    namespaces were built (for tenant ``assumed``, ``""``): asked before each call until
    answered. The answer ``assumed`` settles it; any other means the store refuses every
    namespace the engine has (a daemon with auth): one warning, and the links stop calling
    it. Shared by a link and its siblings (one store, one answer)."""

    def __init__(self, ask: Callable[[float], str], assumed: str, name: str) -> None:
        self._ask = ask
        self.assumed = assumed
        self.name = name
        self.settled = False
        self.refused = False
        self._lock = threading.Lock()

    def ask(self, timeout_s: float) -> bool:
        """Ask now (``KVStoreError`` when the store still cannot say); True when the store's
        tenant is the assumed one."""
        tenant = self._ask(timeout_s)
        with self._lock:
            if self.settled:
                return not self.refused
            self.settled, self.refused = True, tenant != self.assumed
        if self.refused:
            log.warning("kv store %s maps this engine's token to tenant %r, but it was "
                        "unreachable when the engine started and the namespaces were built "
                        "for tenant %r: the store is not used (its blocks are misses); "
                        "restart the engine to use it", self.name, tenant, self.assumed)
        else:
            log.info("kv store %s answered: its tenant is %r, as the engine assumed",
                     self.name, tenant)
        return not self.refused


class KVStoreLink(StoreLink):
    def __init__(
        self,
        store: KVStore,
        ns: Namespace,
        name: str,
        *,
        timeout_s: float = 5.0,
        close_store: bool = True,
        failed_call: tuple[str, Exception] | None = None,
        tenant_check: Callable[[float], str] | TenantCheck | None = None,
        warned: bool = False,
    ) -> None:
        """``close_store=False``: the caller shares ``store`` between engines and closes it
        itself. ``failed_call``: a call made for this link before it existed (the tenant
        question) that failed: counted, and the warning names its error.
        ``tenant_check``: the store could not say its tenant when ``ns`` was built (so
        ``ns.tenant`` is a guess, ``""``): the question (given a timeout), asked again
        before each call until answered (``TenantCheck``). ``warned``: the outage of
        ``failed_call`` was warned about already."""
        self.store = store
        self._close_store = close_store
        self._timeout_s = timeout_s
        self.ns = ns
        self.name = name
        self._lock = threading.Lock()
        self._counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        # "down", "corrupt": the warnings already given
        self._warned: set[str] = {"down"} if warned and failed_call else set()
        self._registered: set[Namespace] = set()
        self._closed = False
        if tenant_check is not None and not isinstance(tenant_check, TenantCheck):
            tenant_check = TenantCheck(tenant_check, ns.tenant, name)
        self._tenant_check = tenant_check  # shared with the siblings
        if failed_call is not None:
            self.note_failure(*failed_call)
        if tenant_check is None or tenant_check.settled:
            self._register(ns, timeout_s)

    @property
    def enabled(self) -> bool:
        """False once the store named another tenant than the namespaces were built for."""
        return self._tenant_check is None or not self._tenant_check.refused

    def _register(self, ns: Namespace, timeout_s: float) -> bool:
        """Register a namespace once; a store that cannot take it now is retried before
        the next call (a daemon that comes back later still gets used)."""
        if ns in self._registered:
            return True
        try:
            self.store.register(ns, timeout_s=timeout_s)
        except KVStoreError as e:
            self.note_failure("register", e)
            return False
        with self._lock:
            self._registered.add(ns)
        return True

    def note_failure(self, call: str, err: Exception) -> None:
        """Count a failed store call and warn if it is the first of its kind."""
        corrupt = isinstance(err, BlockError)
        kind = "corrupt" if corrupt else "down"
        with self._lock:
            self._counters["store_errors_total"] += 1
            self._counters[f"store_errors_{call}"] += 1
            if corrupt:
                self._counters["corrupt_blocks_total"] += 1
            first = kind not in self._warned
            self._warned.add(kind)
        if not first:
            return
        detail = " ".join(f"{type(err).__name__}: {err}".split())
        if corrupt:
            log.warning("kv store %s returned a corrupt block (%s); it counts as a miss",
                        self.name, detail)
        else:
            what = "unreachable" if isinstance(err, StoreUnavailable) else "failing"
            log.warning("kv store %s is %s (%s); its blocks count as misses while it fails",
                        self.name, what, detail)

    def _identified(self, timeout_s: float) -> bool:
        """Whether this link may call the store: its tenant is known to be ``ns``'s."""
        check = self._tenant_check
        if check is None or check.settled:
            return check is None or not check.refused
        try:
            return check.ask(timeout_s)
        except KVStoreError as e:
            self.note_failure("tenant", e)
            return False

    def _guarded(self, call: str, fn: Callable[[], T], miss: T, timeout_s: float,
                 ns: Namespace | None = None) -> T:
        if (self._closed or not self._identified(timeout_s)
                or not self._register(ns or self.ns, timeout_s)):
            return miss
        start = time.perf_counter()
        try:
            return fn()
        except KVStoreError as e:  # a corrupt block is a miss, like any other lost block
            self.note_failure(call, e)
            return miss
        finally:
            self.observe(call, time.perf_counter() - start)

    def lookup(self, keys: Sequence[Key], timeout_s: float,
               ns: Namespace | None = None) -> LookupResult:
        if not keys:
            return LookupResult(hit_blocks=0)
        ns = ns or self.ns
        return self._guarded(
            "lookup",
            lambda: self.store.lookup(ns, keys, timeout_s=timeout_s),
            LookupResult(hit_blocks=0),
            timeout_s,
            ns,
        )

    def get_into(self, keys: Sequence[Key], dst: Any, timeout_s: float,
                 ns: Namespace | None = None) -> int:
        if not keys:
            return 0
        ns = ns or self.ns
        got = self._guarded(
            "get", lambda: self.store.get_into(ns, keys, dst, timeout_s=timeout_s), 0,
            timeout_s, ns,
        )
        with self._lock:
            self._counters["loaded_blocks_total"] += got
            self._counters["loaded_bytes_total"] += got * self.ns.block_bytes
        return got

    def commit(
        self, keys: Sequence[Key], payloads: Mapping[int, Any], timeout_s: float,
        ns: Namespace | None = None,
    ) -> CommitResult:
        ns = ns or self.ns
        res = self._guarded(
            "commit",
            lambda: self.store.commit(ns, keys, payloads, timeout_s=timeout_s),
            CommitResult(dropped=len(payloads)),
            timeout_s,
            ns,
        )
        with self._lock:
            self._counters["committed_blocks_total"] += res.inserted
            self._counters["committed_bytes_total"] += res.inserted * self.ns.block_bytes
            self._counters["commit_dropped_blocks_total"] += res.dropped
        return res

    def note_unsent(self, blocks: int) -> None:
        with self._lock:
            self._counters["commit_unsent_blocks_total"] += blocks

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def stats(self, timeout_s: float = 2.0) -> StoreStats | None:
        return self._guarded("stats", lambda: self.store.stats(timeout_s=timeout_s), None,
                             timeout_s)

    def sibling(self, ns: Namespace) -> StoreLink:
        return type(self)(self.store, ns, self.name, timeout_s=self._timeout_s,
                          close_store=False, tenant_check=self._tenant_check)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._close_store:
            return
        try:
            self.store.close()
        except KVStoreError as e:
            self.note_failure("close", e)


class PrimaryOnlyLink(KVStoreLink):
    """A link whose siblings are null: the engine over it stores and loads only its primary
    namespace. For measurements of bounded replay itself (``replay-fidelity``,
    ``bench/bench_replay.py``): without window tails every bounded hit replays."""

    def sibling(self, ns: Namespace) -> StoreLink:
        return NullStoreLink(ns)
