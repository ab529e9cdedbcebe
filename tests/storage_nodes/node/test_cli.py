"""``kvstore node`` as a process: bad input, directory lock, shutdown, restart, TLS."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.errors import StoreUnavailable
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.node_client import NodeClient
from storage_nodes.testing.node_process import REPO, NodeProcess
from tests.conftest import payload_for, self_signed_cert, small_ns
from tests.storage_nodes.node.conftest import blocks, make_chain

NS = small_ns()


def node_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", "node", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def client(target: str, **kw: object) -> NodeClient:
    return NodeClient(target, ClusterConfig(nodes=(target,), replicas=1, write_quorum=1, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--dir is required"),
        (["--dir", "D", "--capacity", "12XB"], "invalid size"),
        (["--dir", "D", "--capacity", "1KiB"], "smaller than one slab"),
        (["--dir", "D", "--retention", "soon"], "invalid duration"),
        (["--dir", "D", "--listen", "nowhere"], "--listen must be HOST:PORT"),
        (["--dir", "D", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        # Issue 14 (item 12): these were tracebacks.
        (["--dir", "D", "--capacity", str(1 << 70)], "--capacity must be in"),
        (["--dir", "F"], "exists and is not a directory"),
        (["--dir", "D", "--listen", "nosuchhost.invalid:7431"], "cannot resolve"),
        (
            ["--dir", "D", "--listen", "127.0.0.1:0", "--metrics-listen", "nosuch.invalid:1"],
            "--metrics-listen",
        ),
        (["--dir", "D", "--tls-cert", "F", "--tls-key", "F"], "not a PEM certificate"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "F").write_text("a file, not a directory nor a PEM\n")
    args = [str(tmp_path / a) if a in ("D", "F") else a for a in args]
    r = node_cmd(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "D").exists() or not any((tmp_path / "D").iterdir())


def test_second_node_on_a_directory_names_the_holder(tmp_path: Path) -> None:
    with NodeProcess(tmp_path / "n", "1MiB") as first:
        r = node_cmd("--dir", str(tmp_path / "n"), "--capacity", "1MiB", "--listen", "127.0.0.1:0")
        assert r.returncode == 2
        assert "in use" in r.stderr and str(first.pid) in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_sigterm_exits_0_and_a_restart_serves_the_blocks(tmp_path: Path) -> None:
    keys = make_chain(NS, 4, seed=1)
    rows = [memoryview(payload_for(NS, k)) for k in keys]
    node = NodeProcess(tmp_path / "n", "1MiB", ["--retention", "72h"])
    try:
        c = client(node.target)
        assert c.put(NS, keys, blocks(NS, keys)) == bytes([1] * 4)
        c.close()
        assert node.stop() == 0
        assert "stopped" in node.stdout_lines
        node.restart()
        c = client(node.target)
        out = memoryview(bytearray(4 * NS.block_bytes))
        assert c.get(NS, keys, out, {i: i for i in range(4)}).copied == 4
        assert bytes(out) == b"".join(rows)
        c.close()
    finally:
        node.stop()


def test_config_file_supplies_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'dir = "{tmp_path / "n"}"\ncapacity = "2MiB"\nretention = "1h"\n')
    with NodeProcess(tmp_path / "ignored", "1MiB", ["--config", str(cfg)]) as node:
        c = client(node.target)
        st = c.stats()
        c.close()
    # Flags given on the command line win over the file: --dir and --capacity came from
    # NodeProcess, the retention from the file.
    assert st.info["retention_s"] == "3600.0"
    assert st.capacity_bytes == 1 << 20


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_end_to_end(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    keys = make_chain(NS, 2, seed=2)
    with NodeProcess(
        tmp_path / "n", "1MiB", ["--tls-cert", str(cert), "--tls-key", str(key)]
    ) as node:
        c = client(node.target, tls=True, tls_ca_file=str(cert))
        assert c.put(NS, keys, blocks(NS, keys)) == bytes([1, 1])
        assert c.contains(NS, keys) == 2
        c.close()
        plain = client(node.target, rpc_timeout_s=2)
        with pytest.raises(StoreUnavailable):
            plain.contains(NS, keys)
        plain.close()
