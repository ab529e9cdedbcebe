"""Collecting a gone daemon: only after retention plus the skew bound, never a live
one, never twice; peers forget its blocks; a collector fenced mid-way stops."""

from __future__ import annotations

from storage_nodes.sharedfs.collector import collect, dead_daemons
from storage_nodes.sharedfs.errors import LeaseLost
from storage_nodes.sharedfs.layout import Layout
from storage_nodes.sharedfs.lease import claim_owner
from storage_nodes.testing.crash import abandon
from tests.storage_nodes.sharedfs.conftest import NS, FakeClock, chain, config, read, rows

RETENTION, SKEW = 3600.0, 60.0


def _files(root) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file() and "/leases/" not in str(p)}


def test_a_gone_daemon_is_collected_once_after_retention_and_skew(daemons, tmp_path) -> None:
    clock = FakeClock()
    kw = dict(clock=clock, retention_s=RETENTION, clock_skew_s=SKEW, lease_s=600.0)
    a, b, c = daemons("a", **kw), daemons("b", **kw), daemons("c", **kw)
    keys = chain(6)
    a.put(NS, keys, rows(keys))
    b.poll()
    abandon(a)  # gone without a word
    mine = {f for f in _files(tmp_path / "root") if "/a/" in f or f.endswith("/a")}
    assert any("seg-" in f for f in mine) and any("manifest-" in f for f in mine)

    clock.advance(RETENTION)
    assert b.collect() == []  # not yet: retention + skew
    clock.advance(SKEW + 1)
    got_b = b.collect()
    got_c = c.collect()  # the second collector finds nothing left to do
    assert [g.daemon for g in got_b] == ["a"] and got_b[0].complete
    assert set(got_b[0].removed) >= {f for f in mine if "seg-" in f or "manifest-" in f}
    assert got_c == []
    assert not (tmp_path / "root" / "daemons" / "a").exists()
    b.poll()
    assert b.contains(NS, keys) == 0
    assert read(b, keys)[0] == 0
    b.check_integrity()


def test_a_live_daemon_is_never_collected(daemons) -> None:
    clock = FakeClock()
    kw = dict(clock=clock, retention_s=RETENTION, clock_skew_s=SKEW, lease_s=600.0,
              collect_after_s=100.0)
    a, b = daemons("a", **kw), daemons("b", **kw)
    keys = chain(3, seed=1)
    a.put(NS, keys, rows(keys))
    clock.advance(100 + SKEW + 10)  # a's heartbeat looks stale, but a holds its lock
    assert b.collect() == []
    assert a.contains(NS, keys) == 3 and read(a, keys) == (3, rows(keys))


def test_a_collector_fenced_midway_stops(daemons, tmp_path) -> None:
    clock = FakeClock()
    kw = dict(clock=clock, retention_s=RETENTION, clock_skew_s=SKEW, lease_s=600.0)
    a = daemons("a", **kw)
    for seed in range(3):
        keys = chain(4, seed=10 + seed)
        a.put(NS, keys, rows(keys))
    abandon(a)
    clock.advance(RETENTION + SKEW + 1)
    layout = Layout(tmp_path / "root")
    steps = []

    def fencing_clock() -> float:
        steps.append(1)
        if len(steps) == 4:  # the owner comes back between two steps
            claim_owner(layout, "a")
        return clock()

    got = collect(layout, "a", config(tmp_path / "root", "b", **kw), fencing_clock)
    assert got is not None and not got.complete and "fenced" in got.reason
    assert 0 < len(got.removed) < 4
    assert dead_daemons(layout, "b", clock(), RETENTION + SKEW) == ["a"]


def test_lease_lost_is_an_error_type_callers_can_catch() -> None:
    assert issubclass(LeaseLost, Exception)
