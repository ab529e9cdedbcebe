"""Run one of the project's servers (``kvstore serve``, ``kvstore node``) as a child
process on loopback: the one spawner of the daemon's and the node's test harnesses.

The server binds the port it is given (0 at the first start: no port picked in advance that
another process could take) and prints ``listening on HOST:PORT`` first, then ``metrics on
HOST:PORT`` when ``--metrics-listen`` is among its arguments; the spawner waits for them.
``stop()`` sends SIGTERM and waits; ``kill()`` is ``kill -9`` (no shutdown path runs);
``restart()`` starts the same command on the same port again. Always stop what you spawn
(use it as a context manager).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Self

from kvstore.errors import StoreUnavailable

REPO = Path(__file__).resolve().parents[2]


class ServerProcess:
    """``python -m kvstore COMMAND --listen 127.0.0.1:PORT ARGS...`` in a child process.

    ``what`` names the server in errors (``daemon``, ``node``); ``preexec`` runs in the
    child before it starts (e.g. to set a resource limit); ``launcher`` replaces
    ``-m kvstore`` (a test harness that runs the same command, e.g. on a test clock)."""

    proc: subprocess.Popen[str]  # the current child (set by every start)

    def __init__(
        self,
        command: str,
        args: Sequence[str],
        *,
        what: str,
        port: int = 0,
        start_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
        launcher: Sequence[str] = ("-m", "kvstore"),
    ) -> None:
        self.command = command
        self.launcher = list(launcher)
        self.args = list(args)
        self.what = what
        self.port = port
        self.metrics_port: int | None = None
        self.start_timeout_s = start_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self._preexec = preexec
        self._threads: list[threading.Thread] = []
        self._spawn()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"grpc://{self.target}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _spawn(self) -> None:
        cmd = [sys.executable, *self.launcher, self.command,
               "--listen", f"127.0.0.1:{self.port}", *self.args]
        proc = self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            preexec_fn=self._preexec,
        )
        assert proc.stdout is not None and proc.stderr is not None
        self._threads = [self._drain_in_background(proc.stderr, self.stderr_lines)]
        want_metrics = "--metrics-listen" in self.args
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=10)
                self._join()
                raise StoreUnavailable(
                    f"{self.what} exited with {proc.returncode}: "
                    + " | ".join(self.stderr_lines[-5:])
                )
            self.stdout_lines.append(line.rstrip())
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                if not want_metrics:
                    break
            elif line.startswith("metrics on "):
                self.metrics_port = int(line.rsplit(":", 1)[1])
                break
        else:
            self.kill()
            raise StoreUnavailable(f"{self.what} did not start in time")
        self._threads.append(self._drain_in_background(proc.stdout, self.stdout_lines))

    @staticmethod
    def _drain_in_background(stream: IO[str], into: list[str]) -> threading.Thread:
        def drain() -> None:
            for line in stream:
                into.append(line.rstrip())

        t = threading.Thread(target=drain, daemon=True)
        t.start()
        return t

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait (kill -9 if it hangs); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._join()
        return int(self.proc.returncode)

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``stop`` waits)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """``kill -9``: no shutdown path runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._join()

    def restart(self) -> None:
        """Start again on the same port with the same arguments (after ``kill`` or ``stop``)."""
        if self.alive():
            raise RuntimeError(f"{self.what} is still running")
        self._spawn()

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
