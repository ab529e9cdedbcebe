"""``kvstore serve --nodes`` from the command line alone (issue 14, item 10): replicas and
write quorum, node TLS and the node token as flags, one node, and ``--retention`` checked
against what the nodes keep."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.testing.daemon_process import REPO, DaemonProcess
from storage_nodes.testing.local_cluster import LocalCluster
from tests.conftest import self_signed_cert, small_ns
from tests.kvstore.daemon.conftest import make_chain, payloads

NS = small_ns(model_id="cluster-flags")
CHAIN = 3  # blocks each round trip commits


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_serve_nodes_with_tls_token_replicas_and_retention(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    token = secrets.token_hex(16)
    (tmp_path / "node-tokens").write_text(f"{token} *\n")
    (tmp_path / "daemon-node-token").write_text(f"{token}\n")
    node_flags = (
        "--tls-cert", str(cert), "--tls-key", str(key),
        "--auth-token-file", str(tmp_path / "node-tokens"),
        "--retention", "24h",
    )  # fmt: skip
    link = (
        "--node-tls-ca", str(cert),
        "--node-token-file", str(tmp_path / "daemon-node-token"),
        "--retention", "24h",
    )  # fmt: skip
    with LocalCluster(tmp_path / "cluster", 2, "4MiB", node_flags) as cluster:
        one, both = cluster.targets[0], ",".join(cluster.targets)
        # A single node works: replicas default to min(2, nodes).
        with DaemonProcess(["--dram", "4MiB", "--nodes", one, *link]) as d:
            roundtrip(d, seed=1, replicas=1, quorum=1, copies_before=0)
        # The nodes keep the first daemon's copies, so the second one counts on top of them;
        # with write quorum 1, the second replica must be written all the same.
        with DaemonProcess(
            ["--dram", "4MiB", "--nodes", both, "--replicas", "2", "--write-quorum", "1", *link]
        ) as d:
            roundtrip(d, seed=2, replicas=2, quorum=1, copies_before=CHAIN)
        # The retention the daemon promises is the one the nodes keep, or it does not start.
        r = serve("--nodes", both, *link[:-2], "--retention", "72h")
        assert r.returncode == 2 and "keeps idle blocks for 24h" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        # Without the token the nodes refuse the daemon: it serves, but nothing is durable.
        no_token = [*link[:2], *link[4:]]
        with (
            DaemonProcess(["--dram", "4MiB", "--nodes", one, *no_token]) as d,
            GrpcStore(ClientConfig(target=d.target, shm="off", default_timeout_s=5)) as c,
        ):
            c.register(NS)
            keys = make_chain(NS, 2, seed=3)
            res = c.commit(NS, keys, payloads(NS, keys), durability="ssd")
            ssd = next(t for t in c.stats().tiers if t.name == "ssd")
            assert res.durability == "dram"  # acknowledged in DRAM only, truthfully
            assert (ssd.info["ejected"], ssd.info["healthy_nodes"]) == (one, "0")


def roundtrip(
    d: DaemonProcess, seed: int, replicas: int, quorum: int, copies_before: int
) -> None:
    """Commits ``CHAIN`` new blocks durably; the cluster put returns only once every
    replica has answered (not at the write quorum), so the counts are exact on return."""
    keys = make_chain(NS, CHAIN, seed=seed)
    with GrpcStore(ClientConfig(target=d.target, shm="off", default_timeout_s=20)) as c:
        c.register(NS)
        assert c.commit(NS, keys, payloads(NS, keys), durability="ssd").durability == "ssd"
        ssd = next(t for t in c.stats().tiers if t.name == "ssd")
        assert (ssd.info["replicas"], ssd.info["write_quorum"]) == (str(replicas), str(quorum))
        copies = copies_before + CHAIN * replicas
        assert (ssd.counters["cluster_inserted"], ssd.counters["node_blocks"]) == (CHAIN, copies)
        # The tier reports blocks, not copies: ⌈copies on all nodes / replicas⌉.
        assert ssd.size_classes[0].used_blocks == -(-copies // replicas)


def serve(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstore",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--dram",
            "4MiB",
            *flags,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
