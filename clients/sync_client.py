"""``GrpcStore``: the blocking ``KVStore`` client of the cache daemon (DESIGN §5, §7).

One channel per client, reused by every call and thread. Every call has a deadline
(``timeout_s`` or the config's default); UNAVAILABLE is retried with backoff only while
that deadline allows; repeated unavailability opens a circuit breaker so a dead daemon
costs an engine a raised ``StoreUnavailable`` instead of a timeout per request.

Payloads move through the daemon's shared-memory staging segment when the client can
map it (same host, ``shm="auto"``), else as chunked encoded blocks over gRPC.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

from clients import codec
from clients import requests as rq
from clients.attempts import Attempts
from clients.breaker import CircuitBreaker
from clients.config import ClientConfig, config_from_url
from clients.errors import UNAVAILABLE_CODES, StagingLost, error_for
from clients.proto import kvstore_pb2 as pb
from clients.proto import kvstore_pb2_grpc as pb_grpc
from clients.shm import Staging, map_segment
from kvstore.errors import KVStoreError, StoreUnavailable, UnknownNamespace
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult, StoreStats

T = TypeVar("T")


def make_channel(config: ClientConfig) -> grpc.Channel:
    creds = config.channel_credentials()
    if creds is None:
        return grpc.insecure_channel(config.target, config.channel_options())
    return grpc.secure_channel(config.target, creds, config.channel_options())


class GrpcStore(KVStore):
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._channel = make_channel(config)
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._md = config.metadata()
        self.breaker = CircuitBreaker(config.breaker)
        self._staging: Staging | None = None
        self._staging_tried = config.shm == "off"
        self._registered: dict[bytes, Namespace] = {}
        self._staging_lock = threading.Lock()
        self._closed = False
        self.corrupt_blocks = 0

    @classmethod
    def from_url(cls, url: str, *, token_file: str | None = None, **kw: Any) -> GrpcStore:
        return cls(config_from_url(url, token_file=token_file, **kw))

    # -- plumbing -------------------------------------------------------------------
    def _call(self, fn: Callable[[float], T], timeout_s: float | None) -> T:
        """Run ``fn(remaining_s)`` under the deadline, the retry policy and the breaker."""
        if self._closed:
            raise StoreUnavailable("client is closed")
        attempts = Attempts(self.breaker, self.config, timeout_s)
        while True:
            remaining = attempts.start()
            try:
                out = fn(remaining)
            except grpc.RpcError as e:
                time.sleep(attempts.failed(e.code(), e.details()))
                continue
            attempts.succeeded()
            return out

    def _staging_area(self) -> Staging | None:
        if self._staging_tried:
            return self._staging
        with self._staging_lock:
            if not self._staging_tried:
                try:
                    resp = self._call(
                        lambda t: self._stub.OpenStaging(
                            pb.OpenStagingRequest(size_bytes=self.config.shm_bytes),
                            timeout=t,
                            metadata=self._md,
                        ),
                        None,
                    )
                    self._staging = map_segment(resp)
                    if self._staging is None:  # another host: hand the segment back
                        self._close_segment(resp.staging_id)
                except KVStoreError:
                    self._staging = None
                self._staging_tried = True
        return self._staging

    def _drop_staging(self, st: Staging) -> None:
        """The daemon restarted and forgot ``st``: map a fresh segment on the next call.

        The old mapping is not closed here (other threads may still hold views of it); it
        goes when the last of them does.
        """
        with self._staging_lock:
            if self._staging is st:
                self._staging = None
                self._staging_tried = self.config.shm == "off"

    def _reregistering(self, ns: Namespace, fn: Callable[[], T]) -> T:
        """Run ``fn``; if the daemon no longer knows a namespace this client registered (it
        restarted), register it again and retry once instead of calling it misuse."""
        try:
            return fn()
        except UnknownNamespace:
            if self._registered.get(ns.fingerprint) != ns:
                raise
            self.register(ns)
            return fn()

    def _close_segment(self, staging_id: int) -> None:
        with contextlib.suppress(grpc.RpcError):
            self._stub.CloseStaging(
                pb.CloseStagingRequest(staging_id=staging_id), timeout=2, metadata=self._md
            )

    @property
    def uses_shm(self) -> bool:
        return self._staging_area() is not None

    def staging_buffer(self, nbytes: int) -> tuple[int, Any] | None:
        """A buffer inside the shared segment (offset, uint8 array) for zero-copy
        ``get_into``/``commit``; None without the fast path or when the segment is full.
        Release with ``release_buffer(offset)``."""
        st = self._staging_area()
        return None if st is None else st.buffer(nbytes)

    def release_buffer(self, offset: int) -> None:
        if self._staging is not None:
            self._staging.allocator.free(offset)

    # -- KVStore --------------------------------------------------------------------
    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        req = pb.RegisterNamespaceRequest(ns=codec.ns_to_proto(rq.check_ns(ns)))
        self._call(
            lambda t: self._stub.RegisterNamespace(req, timeout=t, metadata=self._md), timeout_s
        )
        self._registered[ns.fingerprint] = ns

    def lookup(
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
        resp = self._reregistering(
            ns,
            lambda: self._call(
                lambda t: self._stub.Lookup(req, timeout=t, metadata=self._md), timeout_s
            ),
        )
        return LookupResult(hit_blocks=resp.hit_blocks, tiers=tuple(resp.tiers))

    def get_into(
        self, ns: Namespace, keys: Sequence[Key], dst: Any, *, timeout_s: float | None = None
    ) -> int:
        rq.check_ns(ns)
        keys = codec.check_keys(keys)
        rows = rq.dst_rows(ns, keys, dst)
        if not keys:
            return 0
        return self._reregistering(ns, lambda: self._get_once(ns, keys, rows, timeout_s))

    def _get_once(
        self, ns: Namespace, keys: list[Key], rows: memoryview, timeout_s: float | None
    ) -> int:
        st = self._staging_area()
        if st is not None:
            got = self._get_staged(st, ns, keys, rows, timeout_s)
            if got is not None:
                return got
        return self._call(lambda t: self._get_grpc(ns, keys, rows, t), timeout_s)

    def _get_grpc(self, ns: Namespace, keys: list[Key], rows: memoryview, t: float) -> int:
        reader = rq.GetReader(ns, keys, rows)
        call = self._stub.Get(
            pb.GetRequest(ns=codec.ns_to_proto(ns), keys=keys), timeout=t, metadata=self._md
        )
        for msg in call:
            if not reader.feed(msg):
                break
        call.cancel()
        self.corrupt_blocks += reader.corrupt_blocks
        return reader.hit

    def _get_staged(
        self, st: Staging, ns: Namespace, keys: list[Key], rows: memoryview, timeout_s: float | None
    ) -> int | None:
        off = st.offset_of(rows)
        owned = off is None
        if owned:
            off = st.allocator.alloc(len(rows))
            if off is None:
                return None  # segment full: the gRPC path
        assert off is not None
        try:
            req = pb.GetStagedRequest(
                ns=codec.ns_to_proto(ns),
                keys=keys,
                staging=pb.StagingRef(staging_id=st.staging_id, offset=off),
            )
            call = lambda t: self._stub.GetStaged(req, timeout=t, metadata=self._md).hit_blocks  # noqa: E731
            try:
                hit = self._call(call, timeout_s)
            except StagingLost:
                self._drop_staging(st)
                return None
            if owned and hit:
                n = hit * ns.block_bytes
                rows[:n] = st.rows(off, n)
            return hit
        finally:
            if owned:
                st.allocator.free(off)

    def commit(
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
        return self._reregistering(
            ns, lambda: self._commit_once(ns, keys, views, durability, timeout_s)
        )

    def _commit_once(
        self,
        ns: Namespace,
        keys: list[Key],
        views: dict[int, memoryview],
        durability: str,
        timeout_s: float | None,
    ) -> CommitResult:
        st = self._staging_area() if views else None
        if st is not None:
            res = self._commit_staged(st, ns, keys, views, durability, timeout_s)
            if res is not None:
                return res
        resp = self._call(
            lambda t: self._stub.Commit(
                rq.commit_chunks(ns, keys, views, durability), timeout=t, metadata=self._md
            ),
            timeout_s,
        )
        return rq.commit_result(resp)

    def _commit_staged(
        self,
        st: Staging,
        ns: Namespace,
        keys: list[Key],
        views: dict[int, memoryview],
        durability: str,
        timeout_s: float | None,
    ) -> CommitResult | None:
        bb = ns.block_bytes
        nbytes = len(views) * bb
        first = next(iter(views.values()))
        off = st.offset_of(first)
        contiguous = off is not None and all(
            st.offset_of(v) == off + j * bb for j, v in enumerate(views.values())
        )
        owned = not contiguous
        if owned:
            off = st.allocator.alloc(nbytes)
            if off is None:
                return None
        assert off is not None
        try:
            if owned:
                area = st.rows(off, nbytes)
                for j, v in enumerate(views.values()):
                    area[j * bb : (j + 1) * bb] = v
            req = rq.staged_commit(
                ns, keys, views, durability, pb.StagingRef(staging_id=st.staging_id, offset=off)
            )
            try:
                resp = self._call(
                    lambda t: self._stub.CommitStaged(req, timeout=t, metadata=self._md), timeout_s
                )
            except StagingLost:
                self._drop_staging(st)
                return None
            return rq.commit_result(resp)
        finally:
            if owned:
                st.allocator.free(off)

    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        req = pb.PrefetchRequest(ns=codec.ns_to_proto(rq.check_ns(ns)), keys=codec.check_keys(keys))
        out: Future[int] = Future()
        out.set_running_or_notify_cancel()
        try:
            if self._closed:
                raise StoreUnavailable("client is closed")
            self.breaker.before_call()
        except StoreUnavailable as e:
            out.set_exception(e)
            return out
        t = self.config.default_timeout_s if timeout_s is None else timeout_s
        call = self._stub.Prefetch.future(req, timeout=t, metadata=self._md)

        def done(f: Any) -> None:
            try:
                out.set_result(f.result().top_tier_blocks)
                self.breaker.on_success()
            except grpc.RpcError as e:
                if e.code() in UNAVAILABLE_CODES:
                    self.breaker.on_failure()
                out.set_exception(error_for(e.code(), e.details()))

        call.add_done_callback(done)
        return out

    def flush(self, *, timeout_s: float | None = None) -> None:
        self._call(
            lambda t: self._stub.Flush(pb.FlushRequest(), timeout=t, metadata=self._md), timeout_s
        )

    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        req = pb.DeleteNamespaceRequest(ns=codec.ns_to_proto(rq.check_ns(ns)))
        resp = self._call(
            lambda t: self._stub.DeleteNamespace(req, timeout=t, metadata=self._md), timeout_s
        )
        return int(resp.deleted_blocks)

    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        resp = self._call(
            lambda t: self._stub.Stats(pb.StatsRequest(), timeout=t, metadata=self._md), timeout_s
        )
        return rq.stats_from_proto(resp)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._staging is not None:
            self._close_segment(self._staging.staging_id)
            self._staging.close()
            self._staging = None
        self._channel.close()
