"""Several daemons on one root (a local directory here; tests/dfs runs the same on
MooseFS and GlusterFS): what one commits, the others hit; a reused slot is a miss."""

from __future__ import annotations

from storage_nodes.sharedfs import manifest as mf
from storage_nodes.testing.crash import abandon
from tests.storage_nodes.sharedfs.conftest import NS, chain, read, rows


def test_a_block_put_through_one_daemon_is_a_hit_through_another(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    keys = chain(8)
    assert a.put(NS, keys, rows(keys)).inserted == 8
    assert b.contains(NS, keys) == 0  # not tailed yet
    b.poll(rescan=False)
    assert b.contains(NS, keys) == 8
    assert read(b, keys) == (8, rows(keys))
    assert b.stats().counters["peers"] == 1
    a.check_integrity()
    b.check_integrity()


def test_a_daemon_registering_late_sees_what_is_there(daemons) -> None:
    a = daemons("a")
    keys = chain(5, seed=1)
    a.put(NS, keys, rows(keys))
    c = daemons("c")  # register() rescans and reads every peer's manifest at once
    assert c.contains(NS, keys) == 5


def test_a_key_present_anywhere_is_only_touched(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    keys = chain(4, seed=2)
    a.put(NS, keys, rows(keys))
    b.poll()
    res = b.put(NS, keys, rows(keys))
    assert (res.inserted, res.present) == (0, 4)
    assert b.stats().counters["blocks"] == 0  # no second copy
    b.flush_touches()
    a.poll()
    assert a.stats().counters["tail_records"] >= 1  # a read b's TOUCH records


def test_a_slot_its_owner_reused_is_a_counted_miss_not_wrong_bytes(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    cap = next(c.capacity_blocks for c in a.stats().size_classes)
    first = chain(cap, seed=3)
    a.put(NS, first, rows(first))
    b.poll()
    assert b.contains(NS, first) == cap
    more = chain(cap // 2, seed=4)
    a.put(NS, more, rows(more))  # evicts first's tail and rewrites its slots
    n, data = read(b, first)  # b has not tailed the evictions yet
    assert data == rows(first[:n])
    assert n < cap
    assert b.stats().counters["stale_slots_total"] == 1
    b.poll()
    assert b.contains(NS, first) == a.contains(NS, first)
    b.check_integrity()


def test_touches_by_a_peer_keep_the_owner_from_evicting(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    cap = next(c.capacity_blocks for c in a.stats().size_classes)
    old, new = chain(cap // 2, seed=5), chain(cap // 2, seed=6)
    a.put(NS, old, rows(old))
    a.put(NS, new, rows(new))
    b.poll()
    assert read(b, old)[0] == len(old)  # b reads old: it becomes the most recent
    b.flush_touches()
    a.poll()
    more = chain(cap // 4, seed=7)
    a.put(NS, more, rows(more))
    assert a.contains(NS, old) == len(old)
    assert a.contains(NS, new) < len(new)


def test_compaction_seals_and_peers_follow_without_a_rescan(daemons) -> None:
    a, b = daemons("a", compact_min_bytes=1), daemons("b")
    keys = chain(40, seed=8)
    a.put(NS, keys, rows(keys))
    b.poll()
    gen = a._ctx.spaces[NS.fingerprint].log.generation
    a.compact()  # grown past 4x its snapshot: a new generation, the old one SEALED
    assert a._ctx.spaces[NS.fingerprint].log.generation == gen + 1
    later = chain(3, seed=9)
    a.put(NS, later, rows(later))
    b.poll(rescan=False)
    assert b.contains(NS, later) == 3 and b.contains(NS, keys) == 40
    assert b._ctx.spaces[NS.fingerprint].tailer.peers["a"].generation == gen + 1


def test_delete_through_one_daemon_drops_every_daemons_blocks(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    ka, kb = chain(3, seed=10), chain(3, seed=11)
    a.put(NS, ka, rows(ka))
    b.put(NS, kb, rows(kb))
    a.poll()
    assert a.delete_namespace(NS) == 6
    b.poll()  # b reads DELETE_NS and drops its own blocks, and says so in its manifest
    assert b.contains(NS, kb) == 0 and b.stats().counters["blocks"] == 0
    b.close()
    b2 = daemons("b")  # after a restart they stay gone
    assert b2.contains(NS, kb) == 0 and b2.stats().counters["blocks"] == 0


def test_a_torn_frame_is_not_applied_and_a_restart_moves_past_it(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    keys = chain(4, seed=12)
    a.put(NS, keys, rows(keys))
    st = a._ctx.spaces[NS.fingerprint]
    whole = mf.puts([mf.PutEntry(b"x" * 16, 1, 1, 1, 1)])
    with open(st.log.path, "ab") as f:  # a crash mid-append: half a frame
        f.write(whole[: len(whole) // 2])
    b.poll()
    assert b.contains(NS, keys) == 4 and b.stats().counters["manifest_stuck_reads"] == 0
    with open(st.log.path, "ab") as f:  # the size ran ahead of the bytes: a bad checksum
        f.write(bytes(len(whole)))
    b.poll()
    assert b.contains(NS, keys) == 4
    assert b.stats().counters["manifest_stuck_reads"] >= 1
    abandon(a)
    a2 = daemons("a")  # recovery starts a new generation; b follows at its rescan
    more = chain(2, seed=13)
    a2.put(NS, more, rows(more))
    b.poll()
    assert b.contains(NS, keys) == 4 and b.contains(NS, more) == 2
    assert read(b, keys) == (4, rows(keys))
