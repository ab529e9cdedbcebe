"""Delegation (DESIGN §7): a token granted ``P/*`` uses ``P/*`` and every ``P/NAME``
tenant, and no other; tested on the rule and against a real daemon."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.errors import AccessDenied
from kvstore.rpcserver.auth import owns
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads, write_tokens
from tests.kvstore.daemon.test_auth import client

names = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1,
                max_size=6)


@given(names, names)
def test_a_plain_tenant_owns_only_itself(a: str, b: str) -> None:
    if a.endswith("/*"):
        return
    assert owns(a, a)
    assert owns(a, b) == (a == b)


@given(names, names, names)
def test_a_delegating_tenant_owns_its_prefix(p: str, name: str, other: str) -> None:
    grant = f"{p}/*"
    assert owns(grant, grant)
    assert owns(grant, f"{p}/{name}")
    assert not owns(grant, p)  # the bare prefix is not below it
    assert not owns(grant, f"{p}/")  # nor is an empty name
    if not f"{other}/".startswith(f"{p}/"):
        assert not owns(grant, f"{other}/{name}")


def test_daemon_accepts_delegated_namespaces_only(spawn_daemon: SpawnDaemon,
                                                  tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", ["engine-1/*", "engine-1/alice"])
    d = spawn_daemon("--auth-token-file", str(tmp_path / "tokens"))
    alice_ns = small_ns(tenant="engine-1/alice")
    bob_ns = small_ns(tenant="engine-1/bob")
    keys = make_chain(alice_ns, 3, seed=2)
    with client(d.target, tokens["engine-1/*"]) as engine, \
            client(d.target, tokens["engine-1/alice"]) as alice:
        assert engine.tenant() == "engine-1/*"
        for ns in (alice_ns, bob_ns, small_ns(tenant="engine-1/*")):
            engine.register(ns)
        engine.commit(alice_ns, keys, payloads(alice_ns, keys))
        engine.flush()
        assert engine.lookup(alice_ns, keys).hit_blocks == 3
        # The sub-tenant's own token reaches its blocks, not its sibling's.
        assert alice.lookup(alice_ns, keys).hit_blocks == 3
        with pytest.raises(AccessDenied):
            alice.lookup(bob_ns, keys)
        for outside in ("engine-1", "engine-2/alice", "alice"):
            with pytest.raises(AccessDenied):
                engine.register(small_ns(tenant=outside))


def test_a_delegating_tokens_stats_cover_all_its_sub_tenants_and_no_other(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    tokens = write_tokens(tmp_path / "tokens", ["engine-1/*", "engine-2/*", "engine-1/alice"])
    d = spawn_daemon("--auth-token-file", str(tmp_path / "tokens"))
    alice_ns, bob_ns = small_ns(tenant="engine-1/alice"), small_ns(tenant="engine-1/bob")
    other_ns = small_ns(tenant="engine-2/carol")
    bb = alice_ns.block_bytes
    with client(d.target, tokens["engine-1/*"]) as engine, \
            client(d.target, tokens["engine-2/*"]) as engine2, \
            client(d.target, tokens["engine-1/alice"]) as alice:
        for ns, n, seed in ((alice_ns, 2, 1), (bob_ns, 3, 2)):
            engine.register(ns)
            keys = make_chain(ns, n, seed=seed)
            engine.commit(ns, keys, payloads(ns, keys))
            engine.lookup(ns, keys)
        engine2.register(other_ns)
        keys = make_chain(other_ns, 7, seed=3)
        engine2.commit(other_ns, keys, payloads(other_ns, keys))
        engine.flush()
        engine2.flush()

        mine = engine.stats()
        dram = next(t for t in mine.tiers if t.name == "dram")
        assert dram.used_bytes == 5 * bb  # alice's 2 and bob's 3, not carol's 7
        assert mine.counters["commit_blocks_total"] == 5
        assert mine.counters["lookups_total"] == 2
        assert mine.counters["lookup_hit_blocks_total"] == 5
        # A sub-tenant's own token still sees only itself.
        theirs = alice.stats()
        assert next(t for t in theirs.tiers if t.name == "dram").used_bytes == 2 * bb
        assert theirs.counters["commit_blocks_total"] == 2
        assert engine2.stats().counters["commit_blocks_total"] == 7
