"""Each thread pins its own torch thread count; a helper's never leaks into the step's."""

from __future__ import annotations

import threading

import pytest
import torch

from kernels.threads import ThreadPlan, pin_compute_threads, pin_helper_thread, thread_plan


def _in_thread(fn) -> int:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(fn()))
    t.start()
    t.join()
    return seen[0]


def test_a_helper_pins_itself_only_and_the_step_thread_repairs_what_it_inherits() -> None:
    before = torch.get_num_threads()
    plan = ThreadPlan(compute_threads=2)
    try:
        pin_compute_threads(plan)

        def helper() -> int:
            pin_helper_thread(plan)
            return torch.get_num_threads()

        assert _in_thread(helper) == 1
        assert torch.get_num_threads() == 2  # the pinned thread kept its own count

        def fresh_step_thread() -> int:
            # A thread started after the helper inherits its 1 until it pins itself.
            pin_compute_threads(plan)
            return torch.get_num_threads()

        assert _in_thread(fresh_step_thread) == 2
    finally:
        torch.set_num_threads(before)


def test_the_plan_follows_affinity_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("KVENGINE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_plan().compute_threads == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert thread_plan().compute_threads == 5
    monkeypatch.setenv("KVENGINE_THREADS", "3")
    assert thread_plan() == ThreadPlan(compute_threads=3, helper_threads=1)
    monkeypatch.setenv("KVENGINE_THREADS", "zero")
    assert thread_plan().compute_threads == 5
