"""``AsyncGrpcStore``: the asyncio client of the cache daemon (``grpc.aio``).

Coroutine versions of every ``KVStore`` method with the same semantics, deadlines,
retry policy, circuit breaker and same-host fast path as ``GrpcStore``; it shares its
request building with the sync client (``clients.requests``). ``BlockingAdapter`` wraps
it as a plain ``KVStore`` (its own event-loop thread), which is how the conformance
suite runs against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from grpc import aio

from clients import codec
from clients import requests as rq
from clients.attempts import Attempts
from clients.breaker import CircuitBreaker
from clients.config import ClientConfig
from clients.proto import kvstore_pb2 as pb
from clients.proto import kvstore_pb2_grpc as pb_grpc
from clients.shm import Staging, map_segment
from kvstore.errors import KVStoreError, StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats

T = TypeVar("T")


def _aio_channel(config: ClientConfig) -> aio.Channel:
    creds = config.channel_credentials()
    if creds is None:
        return aio.insecure_channel(config.target, config.channel_options())
    return aio.secure_channel(config.target, creds, config.channel_options())


class AsyncGrpcStore:
    """Create inside a running event loop; ``await close()`` when done."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._channel = _aio_channel(config)
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._md = config.metadata()
        self.breaker = CircuitBreaker(config.breaker)
        self._staging: Staging | None = None
        self._staging_tried = config.shm == "off"
        self._staging_lock = asyncio.Lock()
        self._closed = False

    async def _call(self, fn: Callable[[float], Awaitable[T]], timeout_s: float | None) -> T:
        if self._closed:
            raise StoreUnavailable("client is closed")
        attempts = Attempts(self.breaker, self.config, timeout_s)
        while True:
            remaining = attempts.start()
            try:
                out = await fn(remaining)
            except aio.AioRpcError as e:
                await asyncio.sleep(attempts.failed(e.code(), e.details()))
                continue
            attempts.succeeded()
            return out

    async def _staging_area(self) -> Staging | None:
        if self._staging_tried:
            return self._staging
        async with self._staging_lock:
            if not self._staging_tried:
                try:
                    req = pb.OpenStagingRequest(size_bytes=self.config.shm_bytes)
                    resp = await self._call(
                        lambda t: self._stub.OpenStaging(req, timeout=t, metadata=self._md), None
                    )
                    self._staging = map_segment(resp)
                    if self._staging is None:
                        await self._close_segment(resp.staging_id)
                except KVStoreError:
                    self._staging = None
                self._staging_tried = True
        return self._staging

    async def _close_segment(self, staging_id: int) -> None:
        with contextlib.suppress(aio.AioRpcError):
            await self._stub.CloseStaging(
                pb.CloseStagingRequest(staging_id=staging_id), timeout=2, metadata=self._md
            )

    async def uses_shm(self) -> bool:
        return await self._staging_area() is not None

    # -- KVStore, as coroutines ---------------------------------------------------------
    async def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        req = pb.RegisterNamespaceRequest(ns=codec.ns_to_proto(rq.check_ns(ns)))
        await self._call(
            lambda t: self._stub.RegisterNamespace(req, timeout=t, metadata=self._md), timeout_s
        )

    async def lookup(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        *,
        timeout_s: float | None = None,
        prompt_tokens: int = 0,
    ) -> LookupResult:
        req = pb.LookupRequest(
            ns=codec.ns_to_proto(rq.check_ns(ns)),
            keys=codec.check_keys(keys),
            prompt_tokens=prompt_tokens,
        )
        resp = await self._call(
            lambda t: self._stub.Lookup(req, timeout=t, metadata=self._md), timeout_s
        )
        return LookupResult(hit_blocks=resp.hit_blocks, tiers=tuple(resp.tiers))

    async def get_into(
        self, ns: Namespace, keys: Sequence[Key], dst: Any, *, timeout_s: float | None = None
    ) -> int:
        rq.check_ns(ns)
        keys = codec.check_keys(keys)
        rows = rq.dst_rows(ns, keys, dst)
        if not keys:
            return 0
        st = await self._staging_area()
        if st is not None:
            off = st.allocator.alloc(len(rows))
            if off is not None:
                try:
                    req = pb.GetStagedRequest(
                        ns=codec.ns_to_proto(ns),
                        keys=keys,
                        staging=pb.StagingRef(staging_id=st.staging_id, offset=off),
                    )
                    done = await self._call(
                        lambda t: self._stub.GetStaged(req, timeout=t, metadata=self._md), timeout_s
                    )
                    hit = done.hit_blocks
                    rows[: hit * ns.block_bytes] = st.rows(off, hit * ns.block_bytes)
                    return hit
                finally:
                    st.allocator.free(off)
        return await self._call(lambda t: self._get_grpc(ns, keys, rows, t), timeout_s)

    async def _get_grpc(self, ns: Namespace, keys: list[Key], rows: memoryview, t: float) -> int:
        reader = rq.GetReader(ns, keys, rows)
        call = self._stub.Get(
            pb.GetRequest(ns=codec.ns_to_proto(ns), keys=keys), timeout=t, metadata=self._md
        )
        async for msg in call:
            if not reader.feed(msg):
                break
        call.cancel()
        return reader.hit

    async def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        rq.check_ns(ns)
        keys = codec.check_keys(keys)
        views = rq.payload_views(ns, keys, payloads)
        codec.durability_to_proto(durability)
        st = await self._staging_area() if views else None
        if st is not None:
            bb = ns.block_bytes
            off = st.allocator.alloc(len(views) * bb)
            if off is not None:
                try:
                    area = st.rows(off, len(views) * bb)
                    for j, v in enumerate(views.values()):
                        area[j * bb : (j + 1) * bb] = v
                    req = rq.staged_commit(
                        ns,
                        keys,
                        views,
                        durability,
                        pb.StagingRef(staging_id=st.staging_id, offset=off),
                    )
                    resp = await self._call(
                        lambda t: self._stub.CommitStaged(req, timeout=t, metadata=self._md),
                        timeout_s,
                    )
                    return rq.commit_result(resp)
                finally:
                    st.allocator.free(off)
        resp = await self._call(
            lambda t: self._stub.Commit(
                rq.commit_chunks(ns, keys, views, durability), timeout=t, metadata=self._md
            ),
            timeout_s,
        )
        return rq.commit_result(resp)

    async def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> int:
        """Awaits the promotion; wrap in ``asyncio.create_task`` to run it in the background."""
        req = pb.PrefetchRequest(ns=codec.ns_to_proto(rq.check_ns(ns)), keys=codec.check_keys(keys))
        resp = await self._call(
            lambda t: self._stub.Prefetch(req, timeout=t, metadata=self._md), timeout_s
        )
        return int(resp.top_tier_blocks)

    async def flush(self, *, timeout_s: float | None = None) -> None:
        await self._call(
            lambda t: self._stub.Flush(pb.FlushRequest(), timeout=t, metadata=self._md), timeout_s
        )

    async def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        req = pb.DeleteNamespaceRequest(ns=codec.ns_to_proto(rq.check_ns(ns)))
        resp = await self._call(
            lambda t: self._stub.DeleteNamespace(req, timeout=t, metadata=self._md), timeout_s
        )
        return int(resp.deleted_blocks)

    async def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        resp = await self._call(
            lambda t: self._stub.Stats(pb.StatsRequest(), timeout=t, metadata=self._md), timeout_s
        )
        return rq.stats_from_proto(resp)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._staging is not None:
            await self._close_segment(self._staging.staging_id)
            self._staging.close()
            self._staging = None
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
        self, ns: Namespace, keys: Sequence[Key], dst: Any, *, timeout_s: float | None = None
    ) -> int:
        return self._run(self.inner.get_into(ns, keys, dst, timeout_s=timeout_s))

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
