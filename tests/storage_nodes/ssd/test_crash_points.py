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
from tests.storage_nodes.ssd.helpers import SLAB, chain, make_config, rows, small_ns, verify_all

REPO = Path(__file__).resolve().parents[3]
# A put in the default (fast) mode never syncs the index; in strict mode every commit does.
CASES = [("fast", p) for p in CRASH_POINTS if p != "index_synced"] + [
    ("strict", p) for p in CRASH_POINTS
]


class Hook:
    def __init__(self, point: str) -> None:
        self.point = point
        self.armed = False

    def __call__(self, point: str) -> None:
        if self.armed and point == self.point:
            raise SimulatedCrash(point)


def _reopen_and_check(d: Path, backend: str, durability: str = "fast") -> SSDTier:
    t = SSDTier(
        make_config(d, io_backend=backend, capacity_bytes=2 * SLAB, index_durability=durability)
    )
    t.register(small_ns())
    t.check_integrity()
    verify_all(t, small_ns())
    return t


@pytest.mark.parametrize(("durability", "point"), CASES)
def test_crash_point_in_process(tmp_path: Path, backend: str, durability: str, point: str) -> None:
    ns = small_ns()
    hook = Hook(point)
    d = tmp_path / "ssd"
    t = SSDTier(
        make_config(
            d,
            io_backend=backend,
            capacity_bytes=2 * SLAB,
            crash_hook=hook,
            index_durability=durability,
        )
    )
    t.register(ns)
    a = chain(ns, 120, salt=1)
    t.put(ns, a, rows(ns, a))
    before = t.contains(ns, a)
    b = chain(ns, 20, salt=2)  # needs eviction, so "after_free" is reached too
    hook.armed = True
    with pytest.raises(SimulatedCrash):
        t.put(ns, b, rows(ns, b))
    abandon(t)
    t2 = _reopen_and_check(d, backend, durability)
    assert t2.contains(ns, b) == 0 or point == "index_synced"  # published just before
    # eviction made room (and committed) before the crash; nothing else of a is lost
    assert before - 20 <= t2.contains(ns, a) < before
    # the store keeps working: freed slots are reusable, b fits now
    r = t2.put(ns, b, rows(ns, b))
    assert r.inserted + r.present == 20
    assert verify_all(t2, ns) == 128
    t2.check_integrity()
    t2.close()


_CHILD = """
import json, os, sys
from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import SLAB, chain, make_config, rows, small_ns
d, backend, point, durability = sys.argv[1:5]
armed = []
def hook(p):
    if armed and p == point:
        os._exit(77)
ns = small_ns()
t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=2 * SLAB, crash_hook=hook,
                        index_durability=durability))
t.register(ns)
a = chain(ns, 120, salt=1)
t.put(ns, a, rows(ns, a))
print(json.dumps(t.contains(ns, a)), flush=True)
armed.append(1)
b = chain(ns, 20, salt=2)
t.put(ns, b, rows(ns, b))
os._exit(0)
"""


@pytest.mark.parametrize(("durability", "point"), CASES)
def test_crash_point_process_exit(tmp_path: Path, durability: str, point: str) -> None:
    backend = backends_here()[0]
    d = tmp_path / "ssd"
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(d), backend, point, durability],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 77, p.stderr
    before = json.loads(p.stdout.strip())
    ns = small_ns()
    t = _reopen_and_check(d, backend, durability)
    assert t.contains(ns, chain(ns, 20, salt=2)) == 0 or point == "index_synced"
    assert before - 20 <= t.contains(ns, chain(ns, 120, salt=1)) < before
    t.close()


def test_pid_in_lock_is_rewritten_after_crash(tmp_path: Path) -> None:
    d = tmp_path / "ssd"
    t = SSDTier(make_config(d))
    abandon(t)
    t = SSDTier(make_config(d))
    assert (d / "LOCK").read_text().strip() == str(os.getpid())
    t.close()
