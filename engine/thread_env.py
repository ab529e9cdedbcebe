"""The OpenMP environment ``kvengine`` starts torch with (issue 33 item 2).

libgomp, torch's OpenMP runtime, reads its variables once, when torch is first imported, so
they are set here, by the entry point (``engine.cli``) before anything imports torch; this
module imports nothing that does.

``GOMP_SPINCOUNT=10000``: after each parallel op, libgomp's worker threads by default spin
300,000 iterations before they sleep. On idle cores that saves a wake-up between the short
ops of a decode step; on a host shared with other processes a spinning worker holds the core
its descheduled partner needs, and every op's barrier waits for it. Measured with
``bench.bench_threads`` (bench/RESULTS.md, "OpenMP wait policy"), SmolLM2 bf16, 2 threads:
under other sessions' load the default spin made prefill and decode 3–6× slower than a
10,000-iteration spin (and passive, no spin at all, faster still); on idle cores the short
spin decodes as fast as the default (0.95× at 1 request, 1.02× at 8) while passive loses a
quarter (0.73×, 0.75×). So the short spin is the default: nearly free on a dedicated host,
most of the gain on a shared one. A variable the user set wins: ``OMP_WAIT_POLICY=PASSIVE``
on a host shared with other CPU-heavy processes, ``OMP_WAIT_POLICY=ACTIVE`` to spin always.
"""

from __future__ import annotations

from collections.abc import MutableMapping

#: What the entry point sets when neither it nor a variable that overrides it is set.
THREAD_ENV_DEFAULTS: dict[str, str] = {"GOMP_SPINCOUNT": "10000"}
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

