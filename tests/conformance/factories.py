"""Every implementation the conformance suites run against.

``TIER_FACTORIES`` build a ``Tier``; ``STORE_FACTORIES`` build a ``KVStore``. Each factory
takes a scratch directory and a capacity in bytes and returns the object plus a
cleanup callable. Add an implementation by adding one entry: the suites pick it up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstore.dram import DramConfig, DramTier
from kvstore.manager import ManagerConfig, TierManager
from kvstore.tier import KVStore, Tier

Made = tuple[Any, Callable[[], None]]
TierFactory = Callable[[Path, int], tuple[Tier, Callable[[], None]]]
StoreFactory = Callable[[Path, int], tuple[KVStore, Callable[[], None]]]


def _dram(tmp: Path, capacity_bytes: int) -> tuple[Tier, Callable[[], None]]:
    tier = DramTier(DramConfig(capacity_bytes, chunk_bytes=capacity_bytes // 4))
    return tier, tier.close


def _manager_dram_dram(tmp: Path, capacity_bytes: int) -> tuple[KVStore, Callable[[], None]]:
    # Until a lower tier exists on every machine, a second DRAM tier plays SSD: the
    # manager's semantics (inclusion, promotion, write-back) do not depend on which.
    top = DramTier(DramConfig(capacity_bytes // 2, chunk_bytes=capacity_bytes // 8))
    low = DramTier(DramConfig(capacity_bytes, chunk_bytes=capacity_bytes // 4, name="ssd"))
    store = TierManager([top, low], ManagerConfig(max_dirty_bytes=capacity_bytes // 4))
    return store, store.close


def _manager_dram(tmp: Path, capacity_bytes: int) -> tuple[KVStore, Callable[[], None]]:
    store = TierManager([DramTier(DramConfig(capacity_bytes, chunk_bytes=capacity_bytes // 4))])
    return store, store.close


#: Tiers spread over independent shards: each shard keeps DESIGN §6's last→first order,
#: so a chain's served prefix only shrinks, but not every block leaves in chain order.
SHARDED_TIERS: set[str] = set()

TIER_FACTORIES: dict[str, TierFactory] = {
    "dram": _dram,
}

STORE_FACTORIES: dict[str, StoreFactory] = {
    "manager-dram": _manager_dram,
    "manager-dram+dram": _manager_dram_dram,
}

#: The tiers each store reports in ``stats()``, top first: what "every tier" means for it,
#: and (a tier named "ssd" below DRAM) the durability a ``durability="ssd"`` commit gets.
STORE_TIERS: dict[str, tuple[str, ...]] = {
    "manager-dram": ("dram",),
    "manager-dram+dram": ("dram", "ssd"),
}

# --- implementations registered by their own packages below this line -------------


def _daemon_store(client: str, shm: str) -> StoreFactory:
    """A real ``kvstore serve`` process on a free loopback port, reached by a client."""

    def make(tmp: Path, capacity_bytes: int) -> tuple[KVStore, Callable[[], None]]:
        from clients.async_client import BlockingAdapter
        from clients.config import ClientConfig
        from clients.sync_client import GrpcStore
        from kvstore.testing.daemon_process import DaemonProcess

        daemon = DaemonProcess(["--dram", str(capacity_bytes)])
        config = ClientConfig(target=daemon.target, shm=shm)
        store: KVStore = GrpcStore(config) if client == "sync" else BlockingAdapter(config)

        def cleanup() -> None:
            store.close()
            daemon.stop()

        return store, cleanup

    return make


# The sync client over the chunked gRPC path, the asyncio one over shared memory.
STORE_FACTORIES["daemon-grpc-sync"] = _daemon_store("sync", "off")
STORE_FACTORIES["daemon-shm-aio"] = _daemon_store("async", "auto")
STORE_TIERS["daemon-grpc-sync"] = STORE_TIERS["daemon-shm-aio"] = ("dram",)


def _ssd_tier(backend: str) -> TierFactory:
    def make(tmp: Path, capacity_bytes: int) -> tuple[Tier, Callable[[], None]]:
        from storage_nodes.ssd import SSDConfig, SSDTier

        tier = SSDTier(
            SSDConfig(
                dir=tmp / f"ssd-{backend}",
                capacity_bytes=capacity_bytes,
                slab_bytes=capacity_bytes // 4,
                io_backend=backend,
                sweep_interval_s=None,
                index_map_bytes=1 << 30,
            )
        )
        return tier, tier.close

    return make


def _ssd_backends() -> list[str]:
    from tests.io_backends import backends_here

    return backends_here()


# The SSD engine on each I/O backend it can use here (io_uring where the kernel allows).
for _backend in _ssd_backends():
    TIER_FACTORIES[f"ssd-{_backend}"] = _ssd_tier(_backend)


def _manager_dram_ssd(tmp: Path, capacity_bytes: int) -> tuple[KVStore, Callable[[], None]]:
    tier, _ = _ssd_tier(_ssd_backends()[0])(tmp, capacity_bytes)
    top = DramTier(DramConfig(capacity_bytes // 2, chunk_bytes=capacity_bytes // 8))
    store = TierManager([top, tier], ManagerConfig(max_dirty_bytes=capacity_bytes // 4))
    return store, store.close


STORE_FACTORIES["manager-dram+ssd"] = _manager_dram_ssd
STORE_TIERS["manager-dram+ssd"] = ("dram", "ssd")


# The storage-node cluster: 3 real `kvstore node` processes on loopback, R=2, started
# in parallel. Fresh nodes per test: an SSD engine keeps emptied slabs assigned to their
# size class, so nodes shared between tests would not start from the capacity a test
# expects.
def _cluster_tier(tmp: Path, capacity_bytes: int) -> tuple[Tier, Callable[[], None]]:
    from storage_nodes.testing.local_cluster import LocalCluster

    cluster = LocalCluster(tmp / "cluster", 3, capacity_bytes, ("--slab", str(capacity_bytes // 8)))
    tier = cluster.tier(replicas=2, write_quorum=2)

    def cleanup() -> None:
        tier.close()
        cluster.stop()

    return tier, cleanup


TIER_FACTORIES["cluster-3x-r2"] = _cluster_tier
SHARDED_TIERS.add("cluster-3x-r2")


# The shared-FS tier: on a local directory (fast), and on a real distributed file
# system started on loopback by tests/dfs (MooseFS, goal 2; GlusterFS, replica 3).
# With KVSTORE_3FS_MOUNT set to a directory on a 3FS mount, also through USRBIO.
def _sharedfs_tier(where: str, backend: str = "posix") -> TierFactory:
    def make(tmp: Path, capacity_bytes: int) -> tuple[Tier, Callable[[], None]]:
        import os
        import shutil
        import uuid

        from storage_nodes.sharedfs import SharedFSConfig, SharedFSTier

        if where == "local":
            root = tmp / "sharedfs"
        elif where == "3fs":
            root = Path(os.environ["KVSTORE_3FS_MOUNT"]) / f"conformance-{uuid.uuid4().hex}"
        else:
            from tests.dfs.cluster import cluster_or_skip

            root = cluster_or_skip(where).mounts[0] / f"conformance-{uuid.uuid4().hex}"
        tier = SharedFSTier(SharedFSConfig(root=root, capacity_bytes=capacity_bytes,
                                           segment_bytes=capacity_bytes // 4,
                                           daemon_id="conformance", io_backend=backend))

        def cleanup() -> None:
            tier.close()
            if where != "local":
                shutil.rmtree(root, ignore_errors=True)

        return tier, cleanup

    return make


# Locally on each POSIX backend (threads, io_uring); on the DFS mounts on the one
# ``auto`` picks there (io_uring where the kernel allows it: CI's machines do).
TIER_FACTORIES["sharedfs-local"] = _sharedfs_tier("local")
if "uring" in _ssd_backends():
    TIER_FACTORIES["sharedfs-local-uring"] = _sharedfs_tier("local", backend="uring")
TIER_FACTORIES["sharedfs-moosefs"] = _sharedfs_tier("moosefs", backend="auto")
TIER_FACTORIES["sharedfs-glusterfs"] = _sharedfs_tier("glusterfs", backend="auto")
if __import__("os").environ.get("KVSTORE_3FS_MOUNT"):
    TIER_FACTORIES["sharedfs-usrbio"] = _sharedfs_tier("3fs", backend="usrbio")
