"""Node auth: bearer tokens, the ``*`` tenant for cache daemons, tenant scoping."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.errors import AccessDenied
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.node_client import NodeClient
from tests.conftest import small_ns
from tests.storage_nodes.node.conftest import StartNode, blocks, make_chain

DAEMON_TOKEN = "daemon-token-0123456789"
ACME_TOKEN = "acme-token-0123456789ab"


def client(port: int, token: str | None) -> NodeClient:
    target = f"127.0.0.1:{port}"
    return NodeClient(
        target,
        ClusterConfig(
            nodes=(target,), replicas=1, write_quorum=1, auth_token=token, rpc_timeout_s=5
        ),
    )


def test_tokens_and_tenants(start_node: StartNode, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"# cache daemons may use any namespace\n{DAEMON_TOKEN} *\n{ACME_TOKEN} acme\n"
    )
    node = start_node(auth_token_file=str(tokens))
    shared, acme = small_ns(), small_ns(tenant="acme")
    keys = make_chain(shared, 2, seed=1)

    daemon = client(node.port, DAEMON_TOKEN)
    assert daemon.put(shared, keys, blocks(shared, keys)) == bytes([1, 1])
    assert daemon.contains(acme, keys) == 0  # '*' reaches every tenant's namespaces

    tenant = client(node.port, ACME_TOKEN)
    assert tenant.contains(acme, keys) == 0
    with pytest.raises(AccessDenied):
        tenant.contains(shared, keys)

    for bad in (None, "wrong-token-0123456789"):
        c = client(node.port, bad)
        with pytest.raises(NodeUnavailable):  # a refused token is a node the cluster cannot use
            c.contains(shared, keys)
        assert c.probe() is False
        c.close()
    assert daemon.probe() is True
    for c in (daemon, tenant):
        c.close()
