"""How many CPU threads each of the engine's threads computes with.

torch's intra-op thread count is per OS thread (OpenMP's ``nthreads`` ICV), and a thread that
has not set one inherits the *last* value any thread set. So the plan is applied by each
thread to itself: the step thread to the cores it may run on (``pin_compute_threads``, cheap
enough to call every step, which also repairs a value inherited from a helper), every
transfer thread (store loader, committer) to one (``pin_helper_thread``), so its block
copies never fork a team that competes with the step's matmuls for the same two cores.
``KVENGINE_THREADS=N`` sets the compute count, else ``OMP_NUM_THREADS`` (the usual knob),
else the usable cores.

Measured here (bench/RESULTS.md): on a machine oversubscribed by other processes, a
two-thread OpenMP team pays a wait at every op's barrier for a thread that is not
scheduled, and one thread can be several times faster; ``KVENGINE_THREADS=1`` is the remedy
on a shared host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    compute_threads: int  # intra-op threads of the thread that runs the model's steps
    helper_threads: int = 1  # of each store transfer thread


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def thread_plan() -> ThreadPlan:
    for name in ("KVENGINE_THREADS", "OMP_NUM_THREADS"):
        forced = os.environ.get(name, "")
        if forced.isdigit() and int(forced) > 0:
            return ThreadPlan(compute_threads=int(forced))
    return ThreadPlan(compute_threads=usable_cores())


def pin_compute_threads(plan: ThreadPlan) -> None:
    if torch.get_num_threads() != plan.compute_threads:
        torch.set_num_threads(plan.compute_threads)


def pin_helper_thread(plan: ThreadPlan) -> None:
    if torch.get_num_threads() != plan.helper_threads:
        torch.set_num_threads(plan.helper_threads)
