"""The cluster client's first calls wait for a node that is starting, as the daemon
clients wait for their daemon (``kvstore.wire.contact``): real storage nodes on 127.0.0.1
started after the cluster client, and a port where nothing listens."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_nodes.cluster import ClusterTier
from storage_nodes.node import NodeConfig, NodeServer
from tests.conftest import small_ns
from tests.storage_nodes.cluster.conftest import counter, make_chain, read_back, rows

NS = small_ns(model_id="cluster-first-contact")
DEADLINE_S = 120.0  # a node's start on a loaded CI machine fits well inside it
OpenCluster = Callable[..., ClusterTier]


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node_on(tmp_path: Path) -> Iterator[Callable[[int], NodeServer]]:
    """``node_on(port)`` starts a real node (gRPC server + SSD engine) on that port."""
    started: list[NodeServer] = []

    def start(port: int) -> NodeServer:
        cap = 4 << 20
        server = NodeServer(
            NodeConfig(
                dir=tmp_path / f"node{port}",
                capacity_bytes=cap,
                listen=f"127.0.0.1:{port}",
                slab_bytes=cap // 8 // 4096 * 4096,
            )
        )
        server.start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


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


def wait_until(pred: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pred()


def test_a_cluster_client_started_before_its_node_uses_it_once_it_starts(
    open_cluster: OpenCluster, node_on: Callable[[int], NodeServer]
) -> None:
    port = closed_port()
    tier = open_cluster((f"127.0.0.1:{port}",), replicas=1, write_quorum=1,
                        rpc_timeout_s=DEADLINE_S)
    keys = make_chain(NS, 4, seed=1)

    def first_calls() -> int:
        tier.register(NS)
        return tier.put(NS, keys, rows(NS, keys)).inserted

    # The first calls are made while nothing listens, and the prober finds nothing there
    # every 0.1 s: the calls wait for the node instead of failing at once (and the node
    # being ejected, its blocks dropped).
    t, out = in_thread(first_calls)
    time.sleep(1.0)
    assert t.is_alive()
    node_on(port)
    t.join(DEADLINE_S)
    assert out == [4]
    assert read_back(tier, NS, keys) == (4, True)
    assert tier.health.snapshot() == (True,)
    assert counter(tier, "cluster_ejections") == 0 and counter(tier, "cluster_dropped") == 0


def test_an_absent_node_costs_one_deadline_then_fails_fast_and_is_ejected(
    open_cluster: OpenCluster,
) -> None:
    port = closed_port()
    tier = open_cluster((f"127.0.0.1:{port}",), replicas=1, write_quorum=1, rpc_timeout_s=1.5)
    keys = make_chain(NS, 2, seed=2)
    start = time.monotonic()
    tier.register(NS)  # waits for the node its whole deadline, then gives the wait up
    assert time.monotonic() - start >= 1.4
    node = tier._nodes[0]
    assert node.contact.state == "gave_up"
    assert "storage node 127.0.0.1:" in str(node.contact.gave_up(1.5, None))
    start = time.monotonic()
    assert tier.put(NS, keys, rows(NS, keys)).dropped == 2
    assert time.monotonic() - start < 1.0  # fails fast now, as once the node had answered
    assert wait_until(lambda: tier.health.snapshot() == (False,))


def test_a_node_started_after_the_client_gave_up_is_used_once_it_answers(
    open_cluster: OpenCluster, node_on: Callable[[int], NodeServer]
) -> None:
    port = closed_port()
    tier = open_cluster((f"127.0.0.1:{port}",), replicas=1, write_quorum=1, rpc_timeout_s=1.0)
    tier.register(NS)
    assert tier._nodes[0].contact.state == "gave_up"
    assert wait_until(lambda: tier.health.snapshot() == (False,))  # probes count now
    node_on(port)
    assert wait_until(lambda: tier.health.snapshot() == (True,))  # re-admitted by probes
    keys = make_chain(NS, 3, seed=3)
    assert tier.put(NS, keys, rows(NS, keys)).inserted == 3
    assert read_back(tier, NS, keys) == (3, True)
    assert tier._nodes[0].contact.state == "answered"
