"""Crash safety (a): a crash at each named point of a put, then reopen and verify.

In process, the hook raises ``SimulatedCrash`` and the tier is abandoned (no flush, no
commit); in a subprocess, the hook calls ``os._exit`` — a real process death with
writes in flight. Either way, every key the index returns must read back exactly, and
``check_integrity`` must pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage_nodes.ssd import CRASH_POINTS, SSDTier
from storage_nodes.testing.crash import SimulatedCrash, abandon
from tests.io_backends import backends_here
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    CrashOn,
    chain,
    make_config,
    rows,
    small_ns,
    verify_all,
)

REPO = Path(__file__).resolve().parents[3]
#: Reached in the data syncer's thread in the default ``behind`` mode (after the put that
#: wrote the data returned), inside the put otherwise.
SYNC_POINTS = ("before_data_sync", "after_data_sync")
# (durability, data_sync, point, nth): crash at the nth time the engine reaches the point.
# A put in the default (fast) mode never syncs the index; in strict mode every commit
# does, and the put of b commits twice: the eviction that makes room, then its publish.
# Strict mode always syncs a put's data inside the put.
CASES = (
    [("fast", "behind", p, 1) for p in CRASH_POINTS if p != "index_synced"]
    + [("fast", "per_put", p, 1) for p in CRASH_POINTS if p != "index_synced"]
    + [("strict", "per_put", p, 1) for p in CRASH_POINTS]
    + [("strict", "per_put", "index_synced", 2)]
)
# The tier holds 128 slots: a takes 120, so the 20 blocks of b need 12 of a evicted first.
A_BLOCKS, B_BLOCKS, SLOTS = 120, 20, 128
EVICTED = B_BLOCKS - (SLOTS - A_BLOCKS)


def in_syncer(data_sync: str, point: str) -> bool:
    return data_sync == "behind" and point in SYNC_POINTS


def b_kept(data_sync: str, point: str, nth: int) -> int:
    """What survives of b: all of it once its publish was synced, or once the put
    returned and a process crash (not a power cut) came behind it, in the syncer;
    nothing before (every other point is before the commit that names b's blocks)."""
    if (point, nth) == ("index_synced", 2) or in_syncer(data_sync, point):
        return B_BLOCKS
    return 0


def _reopen_and_check(d: Path, backend: str, durability: str, data_sync: str) -> SSDTier:
    t = SSDTier(
        make_config(
            d,
            io_backend=backend,
            capacity_bytes=2 * SLAB,
            index_durability=durability,
            data_sync=data_sync,
        )
    )
    t.register(small_ns())
    t.check_integrity()
    verify_all(t, small_ns())
    return t


@pytest.mark.parametrize(("durability", "data_sync", "point", "nth"), CASES)
def test_crash_point_in_process(
    tmp_path: Path, backend: str, durability: str, data_sync: str, point: str, nth: int
) -> None:
    ns = small_ns()
    hook = CrashOn(point, nth)
    d = tmp_path / "ssd"
    t = SSDTier(
        make_config(
            d,
            io_backend=backend,
            capacity_bytes=2 * SLAB,
            crash_hook=hook,
            index_durability=durability,
            data_sync=data_sync,
        )
    )
    t.register(ns)
    a = chain(ns, A_BLOCKS, salt=1)
    t.put(ns, a, rows(ns, a))
    assert t.contains(ns, a) == A_BLOCKS
    assert t.sync()  # a's sync round is over before the hook is armed
    b = chain(ns, B_BLOCKS, salt=2)  # needs eviction, so "after_free" is reached too
    hook.armed = True
    if in_syncer(data_sync, point):
        assert t.put(ns, b, rows(ns, b)).inserted == B_BLOCKS  # no sync inside the put
        assert not t.sync()  # the syncer's thread crashed on b's round
        assert hook.seen == nth
    else:
        with pytest.raises(SimulatedCrash):
            t.put(ns, b, rows(ns, b))
    abandon(t)
    t2 = _reopen_and_check(d, backend, durability, data_sync)
    kept = b_kept(data_sync, point, nth)
    assert t2.contains(ns, b) == kept
    # eviction made room (and committed) before the crash; nothing else of a is lost
    assert t2.contains(ns, a) == A_BLOCKS - EVICTED
    # the store keeps working: freed slots are reusable, b fits now
    r = t2.put(ns, b, rows(ns, b))
    assert (r.inserted, r.present) == (B_BLOCKS - kept, kept)
    assert verify_all(t2, ns) == SLOTS
    t2.check_integrity()
    t2.close()


_CHILD = """
import json, os, sys
from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import SLAB, chain, make_config, rows, small_ns
d, backend, point, durability, data_sync, nth = sys.argv[1:7]
armed, seen = [], []
def hook(p):
    if armed and p == point:
        seen.append(p)
        if len(seen) == int(nth):
            os._exit(77)
ns = small_ns()
t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=2 * SLAB, crash_hook=hook,
                        index_durability=durability, data_sync=data_sync))
t.register(ns)
a = chain(ns, 120, salt=1)
t.put(ns, a, rows(ns, a))
t.sync()
print(json.dumps(t.contains(ns, a)), flush=True)
armed.append(1)
b = chain(ns, 20, salt=2)
t.put(ns, b, rows(ns, b))
t.sync()  # a crash point in the data syncer's thread exits before this returns
os._exit(0)
"""


@pytest.mark.parametrize(("durability", "data_sync", "point", "nth"), CASES)
def test_crash_point_process_exit(
    tmp_path: Path, durability: str, data_sync: str, point: str, nth: int
) -> None:
    backend = backends_here()[0]
    d = tmp_path / "ssd"
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(d), backend, point, durability, data_sync, str(nth)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 77, p.stderr
    assert json.loads(p.stdout.strip()) == A_BLOCKS
    ns = small_ns()
    t = _reopen_and_check(d, backend, durability, data_sync)
    assert t.contains(ns, chain(ns, B_BLOCKS, salt=2)) == b_kept(data_sync, point, nth)
    assert t.contains(ns, chain(ns, A_BLOCKS, salt=1)) == A_BLOCKS - EVICTED
    t.close()


def test_pid_in_lock_is_rewritten_after_crash(tmp_path: Path) -> None:
    d = tmp_path / "ssd"
    t = SSDTier(make_config(d))
    abandon(t)
    t = SSDTier(make_config(d))
    assert (d / "LOCK").read_text().strip() == str(os.getpid())
    t.close()
