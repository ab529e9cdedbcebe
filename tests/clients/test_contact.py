"""A client's first calls wait for its daemon (``kvstore.wire.contact``): real ``kvstore serve``
processes on 127.0.0.1, started after the client, and a port where nothing listens."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from clients.async_client import AsyncGrpcStore
from clients.config import ClientConfig
from clients.errors import CircuitOpen
from clients.sync_client import GrpcStore
from kvstore.errors import StoreUnavailable
from kvstore.testing.daemon_process import REPO, DaemonProcess
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import make_chain, payloads

NS = small_ns(model_id="first-contact")
DEADLINE_S = 120.0  # the daemon's start under a loaded CI machine fits well inside it


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_client_started_before_its_daemon_works_once_it_starts() -> None:
    port = closed_port()
    cfg = ClientConfig(target=f"127.0.0.1:{port}", default_timeout_s=DEADLINE_S)
    with GrpcStore(cfg) as s:
        keys = make_chain(NS, 3, seed=7)
        # The first call is made while nothing listens: the channel is refused, then
        # backs off; the call waits for it instead of failing (and opening the breaker).
        t, out = in_thread(lambda: s.register(NS))
        time.sleep(1.0)
        assert t.is_alive() and s.core.contact.state == "waiting"
        with DaemonProcess(["--dram", "32MiB", "--listen", f"127.0.0.1:{port}"]):
            t.join(DEADLINE_S)
            assert out == [None]
            assert s.commit(NS, keys, payloads(NS, keys, idx=[0, 1, 2])).inserted == 3
            assert s.lookup(NS, keys).hit_blocks == 3
        assert s.breaker.state == "closed" and s.core.contact.state == "answered"


def test_an_async_client_started_before_its_daemon_works_once_it_starts() -> None:
    port = closed_port()
    cfg = ClientConfig(target=f"127.0.0.1:{port}", default_timeout_s=DEADLINE_S, shm="off")

    async def main() -> None:
        s = AsyncGrpcStore(cfg)
        try:
            first = asyncio.ensure_future(s.stats())
            await asyncio.sleep(1.0)
            assert not first.done()
            daemon = await asyncio.to_thread(
                DaemonProcess, ["--dram", "32MiB", "--listen", f"127.0.0.1:{port}"]
            )
            try:
                st = await asyncio.wait_for(first, DEADLINE_S)
                assert st.tiers[0].capacity_bytes == 32 << 20
            finally:
                await asyncio.to_thread(daemon.stop)
        finally:
            await s.close()

    asyncio.run(main())


def test_a_client_pointed_at_nothing_fails_with_one_line_after_its_deadline() -> None:
    port = closed_port()
    with GrpcStore(ClientConfig(target=f"127.0.0.1:{port}", default_timeout_s=1.0)) as s:
        start = time.monotonic()
        with pytest.raises(StoreUnavailable) as e:
            s.stats(timeout_s=1.5)
        took = time.monotonic() - start
        assert not isinstance(e.value, CircuitOpen)
        msg = str(e.value)
        assert f"127.0.0.1:{port}" in msg and "within 1.5 s" in msg and "\n" not in msg
        assert took >= 1.4  # it waited its deadline for the daemon, not the backoff
        assert s.core.contact.state == "gave_up"
        # A daemon that is absent, not starting, costs one deadline: the next call fails
        # fast, as every call to a daemon that went away does.
        start = time.monotonic()
        with pytest.raises(StoreUnavailable):
            s.stats(timeout_s=30)
        assert time.monotonic() - start < 15


def test_kvstore_stats_at_a_closed_port_is_one_line_after_its_timeout() -> None:
    port = closed_port()
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "kvstore", "stats", "--store", f"grpc://127.0.0.1:{port}",
         "--timeout", "1.5"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2 and time.monotonic() - start >= 1.5
    assert r.stderr.splitlines() == [
        f"kvstore stats: error: kv store 127.0.0.1:{port} is not reachable: nothing answered "
        "there within 1.5 s (Deadline Exceeded); is `kvstore serve` listening on that address?"
    ]
