"""Cluster configuration: node lists from flags or TOML, and refused combinations."""

from __future__ import annotations

import pytest

from storage_nodes.cluster import ClusterConfig, open_cluster_tier, parse_nodes
from storage_nodes.cluster.errors import ClusterConfigError


def test_parse_nodes_accepts_flag_and_toml_forms() -> None:
    assert parse_nodes("a:1, b:2,,c:3") == ("a:1", "b:2", "c:3")
    assert parse_nodes(["a:1", "b:2"]) == ("a:1", "b:2")
    assert parse_nodes("[::1]:7431") == ("[::1]:7431",)


@pytest.mark.parametrize("bad", ["a", "a:", ":1", "a:0", "a:70000", "a:x", "a:1,a:1"])
def test_parse_nodes_refuses_bad_addresses(bad: str) -> None:
    with pytest.raises(ClusterConfigError):
        parse_nodes(bad)
    with pytest.raises(ValueError):  # misuse, so the CLI prints one line and exits 2
        parse_nodes(bad)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(nodes=()), "at least one node"),
        (dict(nodes=("a:1", "b:1"), replicas=3), "replicas"),
        (dict(nodes=("a:1", "b:1"), replicas=1, write_quorum=2), "write_quorum"),
        (dict(nodes=("a:1",), replicas=1, write_quorum=1, rpc_timeout_s=0), "rpc_timeout_s"),
        (
            dict(nodes=("a:1",), replicas=1, write_quorum=1, eject_after_failures=0),
            "eject_after_failures",
        ),
        (dict(nodes=("a:1",), replicas=1, write_quorum=1, write_backoff_s=0), "write_backoff_s"),
    ],
)
def test_bad_configs_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message):
        ClusterConfig(**kw)  # type: ignore[arg-type]


def test_defaults_are_r2_w2() -> None:
    c = ClusterConfig(nodes=("a:1", "b:1", "c:1"))
    assert (c.replicas, c.write_quorum, c.name) == (2, 2, "ssd")


def test_open_cluster_tier_reads_the_node_token_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSTORE_NODE_AUTH_TOKEN", "tok-0123456789abcdef")
    tier = open_cluster_tier("127.0.0.1:1", replicas=1, write_quorum=1)
    try:
        assert tier.config.auth_token == "tok-0123456789abcdef"
        assert tier.name == "ssd"
    finally:
        tier.close()


def test_node_token_from_a_file_or_the_environment(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage_nodes.cluster.config import NODE_TOKEN_ENV, node_token

    monkeypatch.setenv(NODE_TOKEN_ENV, "from-the-environment")
    (tmp_path / "bare").write_text("# the daemon's node token\n\nabc123 \n")
    (tmp_path / "node-line").write_text("abc123 *\n")
    (tmp_path / "empty").write_text("# nothing\n")
    assert node_token(str(tmp_path / "bare")) == node_token(str(tmp_path / "node-line")) == "abc123"
    assert node_token(None) == "from-the-environment"
    with pytest.raises(ClusterConfigError, match="holds no token"):
        node_token(str(tmp_path / "empty"))
    with pytest.raises(ClusterConfigError, match="cannot read"):
        node_token(str(tmp_path / "missing"))
