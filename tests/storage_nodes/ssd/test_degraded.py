"""ENOSPC and I/O errors degrade the tier (read-only or off): counted, logged, never an
exception into the caller, never a half-published batch."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.storage_nodes.ssd.helpers import chain, rows, small_ns, verify_all

REPO = Path(__file__).resolve().parents[3]


def test_enospc_on_write_turns_read_only(open_tier, caplog) -> None:
    ns = small_ns()
    t = open_tier(io_backend="faulty")
    t.register(ns)
    a = chain(ns, 10, salt=1)
    t.put(ns, a, rows(ns, a))
    t.io_backend.write_errno = errno.ENOSPC
    b = chain(ns, 5, salt=2)
    r = t.put(ns, b, rows(ns, b))
    assert (r.inserted, r.dropped) == (0, 5)
    st = t.stats()
    assert st.counters["degraded"] == 1 and st.info["mode"] == "read-only"
    assert st.counters["io_errors_total"] >= 1
    assert "degraded to read-only" in caplog.text
    assert t.contains(ns, b) == 0
    assert verify_all(t, ns) == 10  # reads still served
    t.io_backend.write_errno = None
    assert t.put(ns, b, rows(ns, b)).dropped == 5  # read-only until a probe succeeds
    assert t.probe() == "ok"  # the disk takes writes again: back to ok, counted
    assert t.stats().counters["recoveries"] == 1 and t.stats().counters["degraded"] == 0
    assert t.put(ns, b, rows(ns, b)).inserted == 5
    assert verify_all(t, ns) == 15
    t.check_integrity()
    t.close()
    t = open_tier()
    t.register(ns)
    assert t.stats().info["mode"] == "ok" and verify_all(t, ns) == 15


def test_probe_keeps_a_still_failing_tier_degraded(open_tier) -> None:
    ns = small_ns()
    t = open_tier(io_backend="faulty", io_error_limit=2)
    t.register(ns)
    k = chain(ns, 4)
    t.put(ns, k, rows(ns, k))
    t.io_backend.read_errno = errno.EIO
    dst = bytearray(4 * ns.block_bytes)
    # each failed read quarantines the block it failed on: the next read starts after it
    assert t.get_into(ns, k, dst) == 0 and t.get_into(ns, k[1:], dst[: 3 * ns.block_bytes]) == 0
    assert t.mode == "off"
    assert t.probe() == "off"  # slab reads still fail: no recovery
    assert t.stats().counters["recoveries"] == 0
    t.io_backend.read_errno = None
    assert t.probe() == "ok"
    rest = k[2:]
    got = bytearray(2 * ns.block_bytes)
    assert t.get_into(ns, rest, got) == 2 and bytes(got) == rows(ns, rest)
    # the error budget starts again after a recovery: one new error is not "off"
    t.io_backend.read_errno = errno.EIO
    assert t.get_into(ns, rest, got) == 0 and t.mode == "ok"
    t.check_integrity()


@pytest.mark.parametrize("data_sync", ["behind", "per_put"])
def test_background_probe_recovers_without_calls(open_tier, data_sync: str) -> None:
    import time

    ns = small_ns()
    t = open_tier(
        io_backend="faulty", sweep_interval_s=60.0, probe_interval_s=0.05, data_sync=data_sync
    )
    t.register(ns)
    t.io_backend.sync_errno = errno.EIO
    k = chain(ns, 3)
    _put_with_failing_sync(t, ns, k, data_sync)
    assert t.mode == "read-only"
    # A probe while syncs still fail keeps it read-only (asked here: a background probe
    # might not have run yet on a loaded machine, and "still read-only" would then hold
    # vacuously).
    assert t.probe() == "read-only"
    assert t.stats().counters["recoveries"] == 0
    t.io_backend.sync_errno = None
    deadline = time.monotonic() + 10
    while t.mode != "ok" and time.monotonic() < deadline:
        time.sleep(0.05)
    k2 = chain(ns, 3, salt=9)
    assert t.mode == "ok" and t.put(ns, k2, rows(ns, k2)).inserted == 3
    assert t.sync()
    assert t.stats().counters["recoveries"] == 1  # the background probe's, with no call


def _put_with_failing_sync(t, ns, k, data_sync: str) -> None:  # type: ignore[no-untyped-def]
    """A put whose data sync fails: inside the put (``per_put``: the batch is dropped,
    nothing published) or behind it (``behind``: the put was acknowledged as written;
    the ``sync`` that covers it reports the failure, once)."""
    if data_sync == "per_put":
        assert t.put(ns, k, rows(ns, k)).dropped == len(k)
        assert t.contains(ns, k) == 0
    else:
        assert t.put(ns, k, rows(ns, k)).inserted == len(k)
        assert not t.sync()
        assert t.sync()  # reported once: nothing written since
    assert t.stats().counters["io_errors_total"] == 1


def test_disk_filling_mid_batch_publishes_nothing_of_it(open_tier) -> None:
    ns = small_ns()
    t = open_tier(io_backend="faulty")
    t.register(ns)
    t.io_backend.write_budget_bytes = 6 * 4096
    k = chain(ns, 10)
    r = t.put(ns, k, rows(ns, k))
    assert r.inserted == 0 and r.dropped == 10
    assert t.contains(ns, k) == 0
    t.check_integrity()


@pytest.mark.parametrize("data_sync", ["behind", "per_put"])
def test_sync_failure_degrades_to_read_only(open_tier, data_sync: str) -> None:
    ns = small_ns()
    t = open_tier(io_backend="faulty", data_sync=data_sync)
    t.register(ns)
    t.io_backend.sync_errno = errno.EIO
    k = chain(ns, 3)
    _put_with_failing_sync(t, ns, k, data_sync)
    assert t.mode == "read-only"
    k2 = chain(ns, 2, salt=5)
    assert t.put(ns, k2, rows(ns, k2)).dropped == 2  # read-only: puts drop
    t.check_integrity()


def test_read_errors_are_misses_then_off(open_tier) -> None:
    ns = small_ns()
    t = open_tier(io_backend="faulty", io_error_limit=3)
    t.register(ns)
    k = chain(ns, 8)
    t.put(ns, k, rows(ns, k))
    t.io_backend.read_errno = errno.EIO
    dst = bytearray(8 * ns.block_bytes)
    assert t.get_into(ns, k, dst) == 0
    assert t.stats().counters["io_errors_total"] == 1 and t.mode == "ok"
    assert t.get_into(ns, k[1:], dst[: 7 * ns.block_bytes]) == 0
    assert t.get_into(ns, k[2:], dst[: 6 * ns.block_bytes]) == 0
    assert t.mode == "off" and t.stats().counters["degraded"] == 1
    t.io_backend.read_errno = None
    assert t.contains(ns, k) == 0 and t.get_into(ns, k, dst) == 0  # off: all misses
    assert t.put(ns, k, rows(ns, k)).dropped == 8
    t.touch(ns, k)
    t.check_integrity()


_FSIZE_CHILD = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import chain, make_config, rows, small_ns
ns = small_ns()
t = SSDTier(make_config(sys.argv[1], io_backend=sys.argv[2]))
t.register(ns)
resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, 128 << 10))
k = chain(ns, 4)
r = t.put(ns, k, rows(ns, k))
s = t.stats()
print(json.dumps([r.inserted, r.dropped, s.info["mode"], s.counters["io_errors_total"]]))
t.close()
"""


def test_real_file_size_limit_error_degrades(tmp_path: Path, backend: str) -> None:
    """A real kernel error (EFBIG from RLIMIT_FSIZE) while a slab is preallocated."""
    p = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(tmp_path / "ssd"), backend],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    inserted, dropped, mode, errors = json.loads(p.stdout.strip().splitlines()[-1])
    assert (inserted, dropped, mode) == (0, 4, "read-only") and errors >= 1


@pytest.mark.parametrize("backend_name", ["nonsense"])
def test_unknown_backend_is_a_config_error(tmp_path: Path, backend_name: str) -> None:
    from storage_nodes.ssd import SSDConfigError, SSDTier
    from tests.storage_nodes.ssd.helpers import make_config

    with pytest.raises(SSDConfigError, match="unknown ssd io backend"):
        SSDTier(make_config(tmp_path / "ssd", io_backend=backend_name))
    # the failed open released the directory
    SSDTier(make_config(tmp_path / "ssd")).close()


def test_index_full_turns_read_only(open_tier) -> None:
    """A real LMDB MapFullError (a tiny index map) is ENOSPC for the index: read-only."""
    ns = small_ns()
    t = open_tier(index_map_bytes=192 << 10)
    t.register(ns)
    stored = 0
    for salt in range(40):
        k = chain(ns, 24, salt=salt)
        r = t.put(ns, k, rows(ns, k))
        stored += r.inserted
        if r.dropped:
            break
    assert t.mode == "read-only" and t.stats().counters["degraded"] == 1
    assert verify_all(t, ns) == stored  # what was acknowledged is all there
    t.check_integrity()
