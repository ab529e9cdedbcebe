"""Run ``kvstore serve`` as a child process on a free loopback port.

Used by tests, benchmarks and the conformance factories: the daemon binds port 0 and
prints ``listening on HOST:PORT`` first, so there is no window in which another
process can take a port picked in advance. ``stop()`` sends SIGTERM and waits; ``kill()``
is ``kill -9``. Always stop what you spawn (use it as a context manager). The spawning
itself is ``ServerProcess``'s, shared with the node's harness.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvstore.testing.server_process import REPO, ServerProcess

__all__ = ["REPO", "DaemonProcess"]


class DaemonProcess(ServerProcess):
    """``kvstore serve --listen 127.0.0.1:0 ARGS...`` (a later ``--listen`` in ``args``
    wins, as on any command line). With ``clock_file``, its stream idle deadline runs on
    that ``FileClock`` (``kvstore.testing.file_clock``), which the test moves."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        start_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
        clock_file: Path | None = None,
    ) -> None:
        launcher = ("-m", "kvstore") if clock_file is None else (
            "-m", "kvstore.testing.file_clock", str(clock_file)
        )
        super().__init__(
            "serve",
            args,
            what="daemon",
            start_timeout_s=start_timeout_s,
            env=env,
            launcher=launcher,
        )
