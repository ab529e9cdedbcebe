"""Run a gRPC server process until SIGTERM/SIGINT: what `kvstore serve` and `kvstore node`
share at the top of their main loop."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from kvstore.wire.codec import MAX_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class Bound:
    """The ports a server actually bound (port 0 in a flag means any free one)."""

    port: int
    metrics_port: int | None


class Serving(Protocol):
    """A server that binds in ``start``, stops (draining) in ``stop``, and blocks in ``wait``."""

    def start(self) -> Bound: ...

    def stop(self) -> None: ...

    def wait(self) -> None: ...


def grpc_server(workers: int, thread_name_prefix: str) -> tuple[grpc.Server, health.HealthServicer]:
    """A server with ``workers`` RPC threads, the block-sized message limit and the standard
    health service. ``so_reuseport`` is off so that a second process on the same port fails
    to bind instead of silently sharing it."""
    server = grpc.server(
        ThreadPoolExecutor(workers, thread_name_prefix=thread_name_prefix),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=workers * 4,
    )
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    return server, checker


def run_until_signalled(
    server: Serving,
    *,
    command: str,
    host: str,
    listen: str,
    loopback: bool,
    authenticated: bool,
    metrics_listen: str | None,
    exposure: str,
) -> int:
    """Start ``server``, print the bound addresses as the first lines, stop on a signal.

    ``exposure`` completes the warning printed for a non-loopback bind without auth:
    "any host that can reach it can {exposure}".
    """
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    if not loopback and not authenticated:
        print(
            f"{command}: warning: listening on {listen} without --auth-token-file: "
            f"any host that can reach it can {exposure}",
            file=sys.stderr,
        )
    bound = server.start()
    print(f"listening on {host}:{bound.port}", flush=True)
    if bound.metrics_port is not None:
        mhost = metrics_listen.rpartition(":")[0] if metrics_listen else "127.0.0.1"
        print(f"metrics on {mhost}:{bound.metrics_port}", flush=True)

    def on_signal(signum: int, _frame: object) -> None:
        # Stop in another thread: the handler runs in the main thread, which waits below.
        threading.Thread(target=server.stop, name=f"{command}-shutdown").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # CPython runs handlers in the main thread only when it wakes up: parked in a wait
    # without a timeout, it never would for a signal the kernel gave another thread.
    waiter = threading.Thread(target=server.wait, name=f"{command}-wait", daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.5)
    print("stopped", flush=True)
    return 0
