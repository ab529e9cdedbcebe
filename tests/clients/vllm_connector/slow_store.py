"""A gRPC proxy in front of a real ``kvstore serve``: every call is forwarded as it came
(bytes, metadata, deadline); the methods named in ``delays`` are held that many seconds
first, as a daemon starved of CPU would hold them. The same-host staging path still works
through it (the segment's path and nonce travel in the replies).

Tests use it to make "a store call slower than ``call_timeout_s``" deterministic: the
first calls of a fresh client on a loaded 2-core machine take seconds (measured: a first
commit of 9 blocks 1.1-3.4 s, a first load ~1 s at load average ~20)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from kvstore.wire.channel import CHANNEL_OPTIONS

SERVICE = "/kvstore.v1.KVStore/"
_CLIENT_STREAMS = {"Commit"}
_SERVER_STREAMS = {"Get"}


class SlowStore:
    def __init__(self, upstream: str) -> None:
        self._upstream = grpc.insecure_channel(upstream, list(CHANNEL_OPTIONS))
        self._lock = threading.Lock()
        self._delays: dict[str, float] = {}
        self.held: dict[str, int] = {}  # calls held, by method
        self._server = grpc.server(ThreadPoolExecutor(16), handlers=[_Handler(self)],
                                   options=list(CHANNEL_OPTIONS))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def delay(self, **seconds: float) -> None:
        """Hold each later call of these methods (e.g. ``GetStaged=7``); 0 ends it."""
        with self._lock:
            self._delays.update(seconds)

    def hold(self, method: str, ctx: grpc.ServicerContext) -> None:
        with self._lock:
            wait_s = self._delays.get(method, 0.0)
            if wait_s:
                self.held[method] = self.held.get(method, 0) + 1
        end = time.monotonic() + wait_s
        while ctx.is_active() and time.monotonic() < end:
            time.sleep(0.05)

    def forward_kw(self, ctx: grpc.ServicerContext) -> dict[str, Any]:
        left = ctx.time_remaining()
        return {"metadata": tuple(ctx.invocation_metadata()),
                "timeout": None if left is None else max(left, 0.001)}

    def channel(self) -> grpc.Channel:
        return self._upstream

    def close(self) -> None:
        self._server.stop(grace=None)
        self._upstream.close()

    def __enter__(self) -> SlowStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: SlowStore) -> None:
        self._proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = details.method
        if not path.startswith(SERVICE):
            return None
        method = path.removeprefix(SERVICE)
        proxy, ch = self._proxy, self._proxy.channel()

        def relay(call: Any, ctx: grpc.ServicerContext) -> Any:
            try:
                return call()
            except grpc.RpcError as e:  # the daemon's own answer, passed on as it was
                ctx.abort(e.code(), e.details() or "")

        if method in _CLIENT_STREAMS:
            up = ch.stream_unary(path)

            def client_stream(requests: Iterator[bytes], ctx: grpc.ServicerContext) -> Any:
                proxy.hold(method, ctx)
                return relay(lambda: up(requests, **proxy.forward_kw(ctx)), ctx)

            return grpc.stream_unary_rpc_method_handler(client_stream)
        if method in _SERVER_STREAMS:
            up_stream = ch.unary_stream(path)

            def server_stream(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
                proxy.hold(method, ctx)
                try:
                    yield from up_stream(request, **proxy.forward_kw(ctx))
                except grpc.RpcError as e:
                    ctx.abort(e.code(), e.details() or "")

            return grpc.unary_stream_rpc_method_handler(server_stream)
        up_unary = ch.unary_unary(path)

        def unary(request: bytes, ctx: grpc.ServicerContext) -> Any:
            proxy.hold(method, ctx)
            return relay(lambda: up_unary(request, **proxy.forward_kw(ctx)), ctx)

        return grpc.unary_unary_rpc_method_handler(unary)
