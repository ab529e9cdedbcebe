"""``kvstore serve --nodes``: the cache daemon with the cluster as its SSD tier."""

from __future__ import annotations

from pathlib import Path

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.testing.daemon_process import DaemonProcess
from storage_nodes.testing.local_cluster import LocalCluster
from tests.conftest import payload_for, small_ns
from tests.storage_nodes.cluster.conftest import make_chain, read_back

NS = small_ns()


def test_daemon_writes_back_to_the_cluster_and_survives_a_dead_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 3, "8MiB") as cluster:
        keys = make_chain(NS, 6, seed=1)
        with DaemonProcess(["--dram", "4MiB", "--nodes", ",".join(cluster.targets)]) as daemon:
            with GrpcStore(ClientConfig(target=daemon.target, shm="off")) as store:
                store.register(NS)
                res = store.commit(
                    NS, keys, {i: payload_for(NS, k) for i, k in enumerate(keys)}, durability="ssd"
                )
                assert (res.inserted, res.durability) == (6, "ssd")
                tiers = {t.name: t for t in store.stats().tiers}
                assert "ssd" in tiers and tiers["ssd"].info["replicas"] == "2"
            # The blocks are on the cluster, two copies each, readable by any client.
            tier = cluster.tier()
            tier.register(NS)
            assert read_back(tier, NS, keys) == (6, True)
            cluster.nodes[0].kill()
            assert read_back(tier, NS, keys) == (6, True)
            tier.close()
