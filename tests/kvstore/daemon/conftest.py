"""Real daemons on free loopback ports, always stopped by a finalizer."""

from __future__ import annotations

import secrets
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstore.keys import Key, Namespace, chain_keys
from kvstore.testing.daemon_process import DaemonProcess
from tests.conftest import payload_for

SpawnDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def spawn_daemon() -> Iterator[SpawnDaemon]:
    """``spawn_daemon(*flags, clock_file=None)`` starts ``kvstore serve`` (DRAM 16 MiB
    unless given; on a ``FileClock`` when ``clock_file`` is given)."""
    started: list[DaemonProcess] = []

    def spawn(*flags: str, clock_file: Path | None = None) -> DaemonProcess:
        args = list(flags)
        if "--dram" not in args:
            args += ["--dram", "16MiB"]
        d = DaemonProcess(args, clock_file=clock_file)
        started.append(d)
        return d

    yield spawn
    for d in started:
        d.stop()


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProcess]:
    """One DRAM-only daemon for a module's read-mostly tests (metrics served: a test can
    wait on what the daemon has read)."""
    d = DaemonProcess(["--dram", "32MiB", "--metrics-listen", "127.0.0.1:0"])
    try:
        yield d
    finally:
        d.stop()


def make_chain(ns: Namespace, n: int, seed: int) -> list[Key]:
    return chain_keys(ns, np.random.default_rng(seed).integers(0, 50_000, n * ns.block_tokens))


def payloads(ns: Namespace, keys: list[Key], idx: list[int] | None = None) -> dict[int, bytes]:
    return {i: payload_for(ns, keys[i]) for i in (range(len(keys)) if idx is None else idx)}


def write_tokens(path: Path, tenants: list[str]) -> dict[str, str]:
    """Write a ``token tenant`` file; returns tenant -> token."""
    tokens = {tenant: secrets.token_hex(16) for tenant in tenants}
    path.write_text("# test tokens\n\n" + "".join(f"{tok} {t}\n" for t, tok in tokens.items()))
    return tokens


def metric(d: DaemonProcess, name: str, labels: dict[str, str]) -> float:
    """One sample of the daemon's metrics (it must serve them: ``--metrics-listen``)."""
    assert d.metrics_port
    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    # A labelled counter has no sample until its label is first used: that is zero.
    return 0.0


def stream_messages(d: DaemonProcess, method: str) -> float:
    """Messages the daemon has read from ``method`` streams."""
    return metric(d, "kvstore_stream_messages_total", {"method": method})


def finished_calls(d: DaemonProcess, method: str) -> float:
    """``method`` calls the daemon has finished (its store work done, answered or not)."""
    return metric(d, "kvstore_rpc_seconds_count", {"method": method})
