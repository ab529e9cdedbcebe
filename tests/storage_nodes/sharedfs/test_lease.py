"""Fencing tokens: one holder per number, a newer token fences an older holder, expiry
is judged with the clock-skew bound, and the owner's return fences every collector."""

from __future__ import annotations

import threading

import pytest

from storage_nodes.sharedfs.errors import LeaseLost
from storage_nodes.sharedfs.layout import Layout
from storage_nodes.sharedfs.lease import acquire, claim_owner, tokens

LEASE, SKEW = 300.0, 60.0


@pytest.fixture
def layout(tmp_path) -> Layout:
    lay = Layout(tmp_path / "root")
    lay.ensure()
    return lay


def test_one_winner_among_racing_collectors(layout) -> None:
    won: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        lease = acquire(layout, "dead", f"c{i}", LEASE, SKEW, 1000.0)
        if lease is not None:
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert tokens(layout.lease_dir("dead")) == [1]


def test_an_unexpired_lease_stands_until_expiry_plus_skew(layout) -> None:
    held = acquire(layout, "dead", "c1", LEASE, SKEW, 1000.0)
    assert held is not None
    assert acquire(layout, "dead", "c2", LEASE, SKEW, 1000.0 + LEASE) is None
    assert acquire(layout, "dead", "c2", LEASE, SKEW, 1000.0 + LEASE + SKEW) is None
    taken = acquire(layout, "dead", "c2", LEASE, SKEW, 1000.0 + LEASE + SKEW + 1)
    assert taken is not None and taken.token == 2
    with pytest.raises(LeaseLost, match="fenced by token 2"):
        held.check(1001.0)  # the old holder wakes up: fenced before its next step
    taken.check(1000.0 + LEASE + SKEW + 2)


def test_a_holder_stops_skew_before_its_lease_ends(layout) -> None:
    lease = acquire(layout, "dead", "c1", LEASE, SKEW, 0.0)
    assert lease is not None
    lease.check(LEASE - SKEW)
    with pytest.raises(LeaseLost, match="ran out"):
        lease.check(LEASE - SKEW + 0.1)
    # renewing in time moves the end
    lease2 = acquire(layout, "other", "c1", LEASE, SKEW, 0.0)
    assert lease2 is not None
    lease2.renew(100.0)
    lease2.check(100.0 + LEASE - SKEW)


def test_the_owner_coming_back_fences_a_collector(layout) -> None:
    lease = acquire(layout, "d", "c1", LEASE, SKEW, 0.0)
    assert lease is not None
    epoch = claim_owner(layout, "d")
    assert epoch == 2
    with pytest.raises(LeaseLost):
        lease.check(1.0)
    # and a finished collection lets the next one through at once
    lease3 = acquire(layout, "d", "c2", LEASE, SKEW, 5.0)
    assert lease3 is not None and lease3.token == 3
    lease3.finish()
    assert acquire(layout, "d", "c3", LEASE, SKEW, 6.0) is not None


def test_owner_claims_are_unique_and_grow(layout) -> None:
    got = [claim_owner(layout, "d") for _ in range(3)]
    assert got == [1, 2, 3]
