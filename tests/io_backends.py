"""Which SSD I/O backends this test run covers, said once in the pytest header.

``KVSTORE_REQUIRE_URING=1`` (set by ``.ci/run``: the CI machines have io_uring) turns
every io_uring skip or fallback into a failure, so a kernel or sandbox that refuses
io_uring cannot silently shrink the run to the ``pread`` backend. A broken ``liburing``
install is never a skip: ``uring_available`` lets its ImportError through.
"""

from __future__ import annotations

import os

import pytest

from storage_nodes.ssd.backends import uring_available

REQUIRE_ENV = "KVSTORE_REQUIRE_URING"


def uring_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def skip_without_uring() -> None:
    """Skip the calling test where io_uring is refused — or fail it when required."""
    if uring_available():
        return
    why = "io_uring is refused by this kernel / sandbox (io_uring_queue_init failed)"
    if uring_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}")
    pytest.skip(why)


def backends_here() -> list[str]:
    """The real backends to run a test on: uring (where it works, or required) + pread."""
    if uring_available() or uring_required():
        return ["uring", "pread"]
    return ["pread"]


def report_header() -> str:
    if uring_available():
        used = "uring (io_uring) and pread"
    else:
        used = "pread only: io_uring is refused here, its tests skip"
    mode = "io_uring skips are failures" if uring_required() else "io_uring skips allowed"
    env = os.environ.get(REQUIRE_ENV, "")
    return f"kvstore SSD I/O backends: {used}; {REQUIRE_ENV}={env!r} ({mode})"
