"""Three ``kvstore serve --shared-fs`` daemons on one file system: a local directory
(fast, always), MooseFS and GlusterFS on loopback (tests/dfs), each daemon on its own
FUSE mount as separate hosts would be."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from storage_nodes.sharedfs.config import SharedFSConfig
from tests.dfs.cluster import cluster_or_skip
from tests.storage_nodes.sharedfs.conftest import NS, chain, rows
from tests.storage_nodes.sharedfs.daemons import daemons_on

BOUND_S = SharedFSConfig(root=Path("/"), capacity_bytes=1 << 30).visibility_bound_s
# The bound holds for daemons whose poll thread runs on time; that one poll (and one
# rescan) is all it takes is checked without timing in test_sharing.py. Here, with three
# daemon processes and a file system on a loaded 2-core CI machine, a starved poll thread
# may take longer: the commit must still become a hit, within a deadline that only
# catches a hang.
SEEN_WITHIN_S = max(60.0, 10 * BOUND_S)


def roots_for(where: str, tmp_path: Path) -> list[Path]:
    if where == "local":
        return [tmp_path / "shared"] * 3
    c = cluster_or_skip(where)
    name = f"three-{uuid.uuid4().hex[:8]}"
    return [m / name for m in c.mounts]


@pytest.mark.parametrize("where", ["local", "moosefs", "glusterfs"])
def test_a_commit_through_one_daemon_is_a_hit_through_the_others(where, tmp_path) -> None:
    with daemons_on(roots_for(where, tmp_path)) as ds:
        for i, writer in enumerate(ds):
            keys = chain(12, seed=1000 + i)
            payloads = {j: rows([k]) for j, k in enumerate(keys)}
            res = writer.store.commit(NS, keys, payloads, durability="ssd", timeout_s=60)
            assert res.inserted == 12 and res.durability == "ssd"
            t0 = time.monotonic()
            for reader in ds:
                if reader is writer:
                    continue
                while reader.store.lookup(NS, keys, timeout_s=30).hit_blocks < 12:
                    assert time.monotonic() - t0 < SEEN_WITHIN_S, (
                        f"{reader.ident} did not see {writer.ident}'s commit within "
                        f"{SEEN_WITHIN_S} s (visibility bound {BOUND_S} s)")
                    time.sleep(0.05)
                look = reader.store.lookup(NS, keys, timeout_s=30)
                assert look.tiers == ("ssd",) * 12  # from the shared FS, not its own DRAM
                dst = bytearray(12 * NS.block_bytes)
                assert reader.store.get_into(NS, keys, dst, timeout_s=30) == 12
                assert bytes(dst) == rows(keys)
        stats = ds[0].store.stats(timeout_s=30)
        ssd = next(t for t in stats.tiers if t.name == "ssd")
        assert ssd.counters["peers"] == 2 and ssd.info["daemon_id"] == "d1"


def test_the_embedded_store_runs_over_the_shared_fs(tmp_path) -> None:
    from kvstore.embedded import open_embedded

    with open_embedded(4 << 20, shared_fs_dir=str(tmp_path / "s"),
                       shared_fs_capacity_bytes=8 << 20, shared_fs_id="emb") as store:
        store.register(NS)
        keys = chain(6, seed=77)
        store.commit(NS, keys, {j: rows([k]) for j, k in enumerate(keys)}, durability="ssd")
        assert [t.name for t in store.stats().tiers] == ["dram", "ssd"]
        assert next(t for t in store.stats().tiers if t.name == "ssd").counters["blocks"] == 6
    with pytest.raises(ValueError):
        open_embedded(4 << 20, ssd_dir=str(tmp_path / "x"), ssd_capacity_bytes=8 << 20,
                      shared_fs_dir=str(tmp_path / "s"), shared_fs_capacity_bytes=8 << 20)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shared-fs", "D"], "--shared-fs and --shared-fs-capacity go together"),
        (["--shared-fs", "D", "--shared-fs-capacity", "1GiB", "--ssd-dir", "E",
          "--ssd-capacity", "1GiB"], "excludes --ssd-dir"),
        (["--shared-fs-id", "x"], "--shared-fs-id needs --shared-fs"),
    ],
)
def test_bad_shared_fs_flags_are_one_line_and_exit_2(args, message, tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    p = subprocess.run([sys.executable, "-m", "kvstore", "serve", "--listen", "127.0.0.1:0",
                        *[str(tmp_path / a) if a in ("D", "E") else a for a in args]],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1
