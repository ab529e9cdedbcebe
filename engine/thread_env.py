"""The OpenMP environment ``kvengine`` starts torch with (issue 33 item 2).

libgomp, torch's OpenMP runtime, reads its variables once, when torch is first imported, so
they are set here, by the entry point (``engine.cli``) before anything imports torch; this
module imports nothing that does.

``OMP_WAIT_POLICY=PASSIVE``: after each parallel op, libgomp's worker threads by default
spin for a while (``GOMP_SPINCOUNT``) before they sleep. On idle cores that saves a wake-up;
on a host shared with other processes a spinning worker holds the core its descheduled
partner needs, and every op's barrier waits for it. Measured with ``bench.bench_threads``
(bench/RESULTS.md, "OpenMP wait policy"): on this 2-core machine under other sessions'
load, the default policy made prefill and decode many times slower than passive. A variable
the user set wins (``OMP_WAIT_POLICY=ACTIVE`` or a ``GOMP_SPINCOUNT`` restores spinning).
"""

from __future__ import annotations

from collections.abc import MutableMapping

#: What the entry point sets when neither it nor a variable that overrides it is set.
THREAD_ENV_DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
#: Variables that state a wait policy of their own: any of them set, nothing is changed.
_POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def set_thread_env_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Sets the defaults the user has not chosen otherwise; returns what it set. Has an
    effect on torch only when it runs before torch is imported."""
    if any(environ.get(v) for v in _POLICY_VARS):
        return {}
    for k, v in THREAD_ENV_DEFAULTS.items():
        environ[k] = v
    return dict(THREAD_ENV_DEFAULTS)

