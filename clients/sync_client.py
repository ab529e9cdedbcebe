"""``GrpcStore``: the blocking ``KVStore`` client of the cache daemon (DESIGN §5, §7).

A thin façade: what to call, what to retry, when to fall back from the same-host path or
register a forgotten namespace again is decided by ``clients.core.ClientCore`` (shared
with the asyncio client); this module only executes its calls on a blocking channel.

One channel per client, reused by every call and thread. Every call has a deadline
(``timeout_s`` or the config's default); UNAVAILABLE is retried with backoff only while
that deadline allows; repeated unavailability opens a circuit breaker so a dead daemon
costs an engine a raised ``StoreUnavailable`` instead of a timeout per request.

Payloads move through the daemon's shared-memory staging segment when the client can
map it (same host, ``shm="auto"``), else as chunked encoded blocks over gRPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc

from clients.breaker import CircuitBreaker
from clients.config import ClientConfig, config_from_url
from clients.core import ClientCore
from clients.identity import Identity, TenantDeleted
from clients.plan import Call, Plan, T, run_plan
from clients.shm import Staging
from kvstore.errors import StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats
from kvstore.wire.channel import open_channel
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc

_PREFETCH_WORKERS = 4


def make_channel(config: ClientConfig) -> grpc.Channel:
    return open_channel(config.target, tls=config.tls, ca_file=config.tls_ca_file)


class GrpcStore(KVStore):
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.core = ClientCore(config)
        self._channel = make_channel(config)
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._md = config.metadata()
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetcher_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, token_file: str | None = None, **kw: Any) -> GrpcStore:
        return cls(config_from_url(url, token_file=token_file, **kw))

    # -- executing the core's calls ---------------------------------------------------
    def _run(self, plan: Plan[T]) -> T:
        return run_plan(plan, self._execute)

    def _execute(self, call: Call) -> Any:
        attempts = self.core.attempts(call)
        while True:
            remaining = attempts.start()
            try:
                out = self._invoke(call, remaining, attempts.wait_for_ready)
            except grpc.RpcError as e:
                time.sleep(attempts.failed(e.code(), e.details()))
                continue
            attempts.succeeded()
            return out

    def _invoke(self, call: Call, timeout_s: float, wait_for_ready: bool) -> Any:
        method = getattr(self._stub, call.method)
        kw = {"timeout": timeout_s, "metadata": self._md, "wait_for_ready": wait_for_ready}
        if call.stream is not None:
            return method(call.stream(), **kw)
        if call.reader is None:
            return method(call.request, **kw)
        reader = call.reader()
        responses = method(call.request, **kw)
        try:
            for msg in responses:
                if not reader.feed(msg):
                    break
        finally:
            responses.cancel()
        return reader

    # -- what the core shares -----------------------------------------------------------
    @property
    def breaker(self) -> CircuitBreaker:
        return self.core.breaker

    @property
    def corrupt_blocks(self) -> int:
        return self.core.corrupt_blocks

    @property
    def staging(self) -> Staging | None:
        """The mapped staging segment, if any (tests compare it across daemon restarts)."""
        return self.core.staging

    @property
    def uses_shm(self) -> bool:
        return self._run(self.core.staging_area()) is not None

    def staging_buffer(self, nbytes: int) -> tuple[int, Any] | None:
        """A buffer inside the shared segment (offset, uint8 array) for zero-copy
        ``get_into``/``commit``; None without the fast path or when the segment is full.
        Release with ``release_buffer(offset)``; after a call naming it failed without the
        daemon's answer (a timeout), the daemon may still write it: release it, take another."""
        st = self._run(self.core.staging_area())
        return None if st is None else st.buffer(nbytes)

    def release_buffer(self, offset: int) -> None:
        st = self.core.staging
        if st is not None:
            st.allocator.free(offset)

    # -- KVStore --------------------------------------------------------------------
    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        self._run(self.core.register(ns, timeout_s))

    def lookup(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        *,
        timeout_s: float | None = None,
        prompt_tokens: int = 0,
    ) -> LookupResult:
        return self._run(self.core.lookup(ns, keys, timeout_s, prompt_tokens))

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        return self._run(self.core.get_into(ns, keys, dst, timeout_s, checksums))

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        return self._run(self.core.commit(ns, keys, payloads, durability, timeout_s))

    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        """Runs in the background on a small pool of this client's threads."""
        try:
            plan = self.core.prefetch(ns, keys, timeout_s)  # misuse raises here, at once
            pool = self._prefetch_pool()
            return pool.submit(self._run, plan)
        except (StoreUnavailable, RuntimeError) as e:
            out: Future[int] = Future()
            out.set_exception(e if isinstance(e, StoreUnavailable) else StoreUnavailable(str(e)))
            return out

    def _prefetch_pool(self) -> ThreadPoolExecutor:
        with self._prefetcher_lock:
            if self.core.closed:
                raise StoreUnavailable("client is closed")
            if self._prefetcher is None:
                self._prefetcher = ThreadPoolExecutor(
                    _PREFETCH_WORKERS, thread_name_prefix="kvstore-client-prefetch"
                )
            return self._prefetcher

    def flush(self, *, timeout_s: float | None = None) -> None:
        self._run(self.core.flush(timeout_s))

    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        return self._run(self.core.delete_namespace(ns, timeout_s))

    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        return self._run(self.core.stats(timeout_s))

    def tenant(self, *, timeout_s: float | None = None) -> str:
        """The tenant of this client's token, for the namespaces it builds (asked once,
        then remembered)."""
        known = self.core.identity
        return (known or self.whoami(timeout_s=timeout_s)).tenant

    def whoami(self, *, timeout_s: float | None = None) -> Identity:
        """The tenant this client's token maps to (build namespaces with it) and its rights."""
        return self._run(self.core.whoami(timeout_s))

    def delete_tenant(self, tenant: str, *, timeout_s: float | None = None) -> TenantDeleted:
        """Admin only (``NotAdmin`` otherwise): drop every namespace of ``tenant`` the
        daemon has known, from every tier."""
        return self._run(self.core.delete_tenant(tenant, timeout_s))

    def close(self) -> None:
        if self.core.closed:
            return
        self._run(self.core.close())
        with self._prefetcher_lock:
            pool, self._prefetcher = self._prefetcher, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._channel.close()
