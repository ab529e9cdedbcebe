"""Tenant-scoped Stats and Flush, WhoAmI, and an admin deleting a whole tenant
(issue 14, item 6; DESIGN §7) against real daemons."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.config import ClientConfig
from clients.errors import NotAdmin
from clients.sync_client import GrpcStore
from kvstore.rpcserver.auth import load_token_file
from storage_nodes.ssd.config import slot_bytes_for
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads, write_tokens

NS_A = small_ns(tenant="alice")
NS_B = small_ns(tenant="bob")
NS_B2 = small_ns(tenant="bob", model_id="bob-second")
BB = NS_A.block_bytes


def tokens_with_admin(path: Path) -> dict[str, str]:
    tokens = write_tokens(path, ["alice", "bob"])
    tokens["ops"] = "o" * 32
    with path.open("a") as f:
        f.write(f"{tokens['ops']} ops admin\n")
    return tokens


def client(target: str, token: str) -> GrpcStore:
    return GrpcStore(ClientConfig(target=target, auth_token=token, shm="off", default_timeout_s=20))


def test_token_file_marks_admins(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    tokens = tokens_with_admin(f)
    auth = load_token_file(str(f))
    ops = auth.caller([("authorization", f"Bearer {tokens['ops']}")])
    alice = auth.caller([("authorization", f"Bearer {tokens['alice']}")])
    assert (ops.tenant, ops.admin, ops.sees_everything) == ("ops", True, True)
    assert (alice.tenant, alice.admin, alice.sees_everything) == ("alice", False, False)
    f.write_text(f"{'a' * 20} alice root\n")
    with pytest.raises(ValueError):
        load_token_file(str(f))


def test_whoami(spawn_daemon: SpawnDaemon, tmp_path: Path) -> None:
    tokens = tokens_with_admin(tmp_path / "tokens")
    d = spawn_daemon("--auth-token-file", str(tmp_path / "tokens"))
    with client(d.target, tokens["alice"]) as a, client(d.target, tokens["ops"]) as o:
        me = a.whoami()
        assert (me.tenant, me.admin, me.authenticated) == ("alice", False, True)
        assert a.tenant() == "alice"
        from engine.connector.stores import store_tenant  # what the engine builds namespaces with

        assert store_tenant(a) == "alice"
        assert o.whoami().admin
    open_daemon = spawn_daemon()
    with GrpcStore(ClientConfig(target=open_daemon.target, shm="off")) as c:
        me = c.whoami()
        assert (me.tenant, me.authenticated) == ("", False)


def test_stats_and_flush_are_scoped_to_the_tenant(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    tokens = tokens_with_admin(tmp_path / "tokens")
    d = spawn_daemon(
        "--auth-token-file",
        str(tmp_path / "tokens"),
        "--ssd-dir",
        str(tmp_path / "ssd"),
        "--ssd-capacity",
        "64MiB",
    )
    with (
        client(d.target, tokens["alice"]) as a,
        client(d.target, tokens["bob"]) as b,
        client(d.target, tokens["ops"]) as o,
    ):
        a.register(NS_A)
        b.register(NS_B)
        ka, kb = make_chain(NS_A, 3, seed=1), make_chain(NS_B, 5, seed=2)
        a.commit(NS_A, ka, payloads(NS_A, ka))
        b.commit(NS_B, kb, payloads(NS_B, kb))
        assert a.lookup(NS_A, ka).hit_blocks == 3
        assert a.get_into(NS_A, ka, bytearray(3 * BB)) == 3
        a.flush()  # waits for alice's blocks
        b.flush()

        mine = a.stats()
        dram = next(t for t in mine.tiers if t.name == "dram")
        assert dram.used_bytes == 3 * BB
        assert [(c.block_bytes, c.used_blocks) for c in dram.size_classes] == [(BB, 3)]
        assert dram.capacity_bytes == 16 << 20  # configuration, not usage
        assert dram.counters == {} and dram.info["held"] == "exact"
        daemon_side = {
            k: v
            for k, v in mine.counters.items()
            if "corrupt" not in k and not k.startswith("client_")  # the client's own
        }
        assert daemon_side == {
            "lookups_total": 1,
            "lookup_blocks_total": 3,
            "lookup_hit_blocks_total": 3,
            "gets_total": 1,
            "get_blocks_total": 3,
            "get_hit_blocks_total": 3,
            "commits_total": 1,
            "commit_blocks_total": 3,
            "commit_present_blocks_total": 0,
            "dropped_blocks_total": 0,
        }
        # Issue 36 (item 7): "ssd: 0 B" after the tenant's blocks were flushed to SSD.
        ssd = next(t for t in mine.tiers if t.name == "ssd")
        assert [(c.block_bytes, c.used_blocks) for c in ssd.size_classes] == [(BB, 3)]
        assert ssd.used_bytes == 3 * slot_bytes_for(BB) and ssd.info["held"] == "exact"
        theirs = b.stats()
        assert next(t for t in theirs.tiers if t.name == "dram").used_bytes == 5 * BB
        assert next(t for t in theirs.tiers if t.name == "ssd").used_bytes == 5 * slot_bytes_for(
            BB
        )
        assert theirs.counters["commit_blocks_total"] == 5
        assert theirs.counters["lookups_total"] == 0

        whole = o.stats()  # the admin sees the whole daemon, the store's own counters
        by_name = {t.name: t for t in whole.tiers}
        assert by_name["dram"].used_bytes == 8 * BB
        # Both tenants' flushes reached SSD: 8 slots, each a block with its header.
        assert by_name["ssd"].used_bytes == 8 * slot_bytes_for(BB)
        assert whole.counters["commits_total"] == 2
        assert by_name["dram"].counters["put_blocks"] == 8


def test_admin_deletes_a_whole_tenant_even_after_a_restart(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    tokens = tokens_with_admin(tmp_path / "tokens")
    flags = (
        "--auth-token-file",
        str(tmp_path / "tokens"),
        "--ssd-dir",
        str(tmp_path / "ssd"),
        "--ssd-capacity",
        "64MiB",
    )
    d = spawn_daemon(*flags)
    ka, kb, kb2 = make_chain(NS_A, 2, seed=3), make_chain(NS_B, 3, seed=4), make_chain(NS_B2, 4, 5)
    with client(d.target, tokens["alice"]) as a, client(d.target, tokens["bob"]) as b:
        a.register(NS_A)
        b.register(NS_B)
        b.register(NS_B2)
        a.commit(NS_A, ka, payloads(NS_A, ka), durability="ssd")
        b.commit(NS_B, kb, payloads(NS_B, kb), durability="ssd")
        b.commit(NS_B2, kb2, payloads(NS_B2, kb2), durability="ssd")
        with pytest.raises(NotAdmin):
            b.delete_tenant("alice")
    assert d.stop() == 0
    d = spawn_daemon(*flags)  # its DRAM is empty; bob's blocks are on SSD only
    with client(d.target, tokens["ops"]) as o:
        done = o.delete_tenant("bob")
        assert (done.namespaces, done.deleted_blocks) == (2, 7)
        assert o.delete_tenant("bob").namespaces == 0
    with client(d.target, tokens["alice"]) as a, client(d.target, tokens["bob"]) as b:
        b.register(NS_B)
        b.register(NS_B2)
        assert b.lookup(NS_B, kb).hit_blocks == 0
        assert b.lookup(NS_B2, kb2).hit_blocks == 0
        a.register(NS_A)
        assert a.lookup(NS_A, ka).hit_blocks == 2
