"""Run ``kvstore serve`` as a child process on a free loopback port.

Used by tests, benchmarks and the conformance factories: the daemon binds port 0 and
prints ``listening on HOST:PORT`` first, so there is no window in which another
process can take a port picked in advance. ``stop()`` sends SIGTERM and waits; ``kill()``
is ``kill -9``. Always stop what you spawn (use it as a context manager).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kvstore.errors import StoreUnavailable

REPO = Path(__file__).resolve().parents[2]


class DaemonProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        start_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ):
        cmd = [sys.executable, "-m", "kvstore", "serve", "--listen", "127.0.0.1:0", *args]
        self.args = list(args)
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self.port = 0
        self.metrics_port: int | None = None
        deadline = time.monotonic() + start_timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=10)
                raise StoreUnavailable(
                    f"daemon exited with {self.proc.returncode}: "
                    f"{' | '.join(self.stderr_lines[-5:])}"
                )
            self.stdout_lines.append(line.rstrip())
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                if "--metrics-listen" not in self.args:
                    break
            elif line.startswith("metrics on "):
                self.metrics_port = int(line.rsplit(":", 1)[1])
                break
        else:
            self.kill()
            raise StoreUnavailable("daemon did not start in time")
        self._out_thread = threading.Thread(target=self._drain_stdout, daemon=True)
        self._out_thread.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip())

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_lines.append(line.rstrip())

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit status (kill -9 if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._join()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._join()

    def _join(self) -> None:
        self._err_thread.join(timeout=5)
        t = getattr(self, "_out_thread", None)
        if t is not None:
            t.join(timeout=5)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
