"""``AsyncGrpcStore``: the asyncio client of the cache daemon (``grpc.aio``).

Coroutine versions of every ``KVStore`` method. Like ``GrpcStore`` it is a thin façade
over ``clients.core.ClientCore``, which makes every decision (deadlines, retries, the
breaker, the same-host path and its fallback when a restarted daemon lost the segment,
registering a forgotten namespace again); this module only awaits the calls.
``BlockingAdapter`` wraps it as a plain ``KVStore`` (its own event-loop thread), which
is how the conformance suite runs against it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from grpc import aio

from clients.breaker import CircuitBreaker
from clients.config import ClientConfig
from clients.core import ClientCore
from clients.identity import Identity, TenantDeleted
from clients.plan import Call, Plan, T, run_plan_async
from clients.shm import Staging
from kvstore.errors import StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc


def _aio_channel(config: ClientConfig) -> aio.Channel:
    creds = config.channel_credentials()
    if creds is None:
        return aio.insecure_channel(config.target, config.channel_options())
    return aio.secure_channel(config.target, creds, config.channel_options())


class AsyncGrpcStore:
    """Create inside a running event loop; ``await close()`` when done."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.core = ClientCore(config)
        self._channel = _aio_channel(config)
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._md = config.metadata()

    # -- executing the core's calls ---------------------------------------------------
    async def _run(self, plan: Plan[T]) -> T:
        return await run_plan_async(plan, self._execute)

    async def _execute(self, call: Call) -> Any:
        attempts = self.core.attempts(call)
        while True:
            remaining = attempts.start()
            try:
                out = await self._invoke(call, remaining, attempts.wait_for_ready)
            except aio.AioRpcError as e:
                await asyncio.sleep(attempts.failed(e.code(), e.details()))
                continue
            attempts.succeeded()
            return out

    async def _invoke(self, call: Call, timeout_s: float, wait_for_ready: bool) -> Any:
        method = getattr(self._stub, call.method)
        kw = {"timeout": timeout_s, "metadata": self._md, "wait_for_ready": wait_for_ready}
        if call.stream is not None:
            return await method(call.stream(), **kw)
        if call.reader is None:
            return await method(call.request, **kw)
        reader = call.reader()
        responses = method(call.request, **kw)
        try:
            async for msg in responses:
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
        return self.core.staging

    async def uses_shm(self) -> bool:
        return await self._run(self.core.staging_area()) is not None

    # -- KVStore, as coroutines ---------------------------------------------------------
    async def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        await self._run(self.core.register(ns, timeout_s))

    async def lookup(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        *,
        timeout_s: float | None = None,
        prompt_tokens: int = 0,
    ) -> LookupResult:
        return await self._run(self.core.lookup(ns, keys, timeout_s, prompt_tokens))

    async def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        return await self._run(self.core.get_into(ns, keys, dst, timeout_s, checksums))

    async def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        return await self._run(self.core.commit(ns, keys, payloads, durability, timeout_s))

    async def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> int:
        """Awaits the promotion; wrap in ``asyncio.create_task`` to run it in the background."""
        return await self._run(self.core.prefetch(ns, keys, timeout_s))

    async def flush(self, *, timeout_s: float | None = None) -> None:
        await self._run(self.core.flush(timeout_s))

    async def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        return await self._run(self.core.delete_namespace(ns, timeout_s))

    async def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        return await self._run(self.core.stats(timeout_s))

    async def whoami(self, *, timeout_s: float | None = None) -> Identity:
        """The tenant this client's token maps to (build namespaces with it) and its rights."""
        return await self._run(self.core.whoami(timeout_s))

    async def delete_tenant(self, tenant: str, *, timeout_s: float | None = None) -> TenantDeleted:
        """Admin only (``NotAdmin`` otherwise): drop every namespace of ``tenant`` the
        daemon has known, from every tier."""
        return await self._run(self.core.delete_tenant(tenant, timeout_s))

    async def close(self) -> None:
        if self.core.closed:
            return
        await self._run(self.core.close())
        await self._channel.close()


class BlockingAdapter(KVStore):
    """A ``KVStore`` over an ``AsyncGrpcStore`` running on a private event-loop thread."""

    def __init__(self, config: ClientConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kvstore-aio", daemon=True
        )
        self._thread.start()

        async def make() -> AsyncGrpcStore:
            return AsyncGrpcStore(config)

        self.inner: AsyncGrpcStore = self._run(make())
        self._closed = False

    @property
    def breaker(self) -> CircuitBreaker:
        return self.inner.breaker

    @property
    def staging(self) -> Staging | None:
        return self.inner.staging

    @property
    def uses_shm(self) -> bool:
        return self._run(self.inner.uses_shm())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if getattr(self, "_closed", False):
            coro.close()
            raise StoreUnavailable("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        self._run(self.inner.register(ns, timeout_s=timeout_s))

    def lookup(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> LookupResult:
        return self._run(self.inner.lookup(ns, keys, timeout_s=timeout_s))

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        return self._run(
            self.inner.get_into(ns, keys, dst, timeout_s=timeout_s, checksums=checksums)
        )

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        return self._run(
            self.inner.commit(ns, keys, payloads, durability=durability, timeout_s=timeout_s)
        )

    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        if self._closed:
            out: Future[int] = Future()
            out.set_exception(StoreUnavailable("client is closed"))
            return out
        return asyncio.run_coroutine_threadsafe(
            self.inner.prefetch(ns, keys, timeout_s=timeout_s), self._loop
        )

    def flush(self, *, timeout_s: float | None = None) -> None:
        self._run(self.inner.flush(timeout_s=timeout_s))

    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        return self._run(self.inner.delete_namespace(ns, timeout_s=timeout_s))

    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        return self._run(self.inner.stats(timeout_s=timeout_s))

    def close(self) -> None:
        if self._closed:
            return
        self._run(self.inner.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
