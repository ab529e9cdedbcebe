"""Health tracking: ejection after consecutive failures, re-admission by probes only."""

from __future__ import annotations

import threading

from storage_nodes.cluster.health import HealthTracker, Prober


def test_ejection_and_readmission() -> None:
    h = HealthTracker(["a:1", "b:1"], eject_after_failures=2, readmit_after_successes=3)
    h.failure(0)
    assert h.healthy(0)  # one failure is not enough
    h.success(0)
    h.failure(0)
    assert h.healthy(0)  # consecutive failures only
    h.failure(0)
    assert not h.healthy(0) and h.snapshot() == (False, True)
    h.success(0)  # a call success does not re-admit: only probes do
    assert not h.healthy(0)
    h.success(0, probe=True)
    h.success(0, probe=True)
    h.failure(0)  # a failed probe restarts the count
    for _ in range(2):
        h.success(0, probe=True)
    assert not h.healthy(0)
    h.success(0, probe=True)
    assert h.healthy(0)
    assert (h.counters["ejections"], h.counters["readmissions"]) == (1, 1)
    h.check_integrity()


def test_prober_drives_the_tracker() -> None:
    h = HealthTracker(["a:1", "b:1"], eject_after_failures=1, readmit_after_successes=1)
    up = [True, False]
    seen = threading.Event()

    def probe(i: int) -> bool:
        if i == 1 and not up[1]:
            seen.set()
        return up[i]

    p = Prober(h, probe, interval_s=0.01)
    try:
        assert seen.wait(5)
        p.probe_all()
        assert h.snapshot() == (True, False)
        up[1] = True
        p.probe_all()
        assert h.snapshot() == (True, True)
    finally:
        p.stop()
    h.check_integrity()


def test_a_raising_probe_counts_as_a_failure() -> None:
    h = HealthTracker(["a:1"], eject_after_failures=1, readmit_after_successes=1)

    def probe(i: int) -> bool:
        raise OSError("boom")

    p = Prober(h, probe, interval_s=60)
    try:
        p.probe_all()
        assert not h.healthy(0)
    finally:
        p.stop()
