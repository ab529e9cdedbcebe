"""Run ``kvstore node`` as a child process on loopback (tests, benchmarks, factories).

The first start binds port 0 and reads ``listening on HOST:PORT`` from stdout (no
port race); ``restart()`` binds that same port again, because a cluster's membership
names nodes by address. ``kill()`` is ``kill -9``. ``file_size_limit_bytes`` sets
``RLIMIT_FSIZE`` in the child: writes past it fail with EFBIG, which the SSD engine
treats as a full disk (tests use it to fill a disk without a special file system).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kvstore.errors import StoreUnavailable

REPO = Path(__file__).resolve().parents[2]


class NodeProcess:
    def __init__(
        self,
        directory: Path | str,
        capacity: str | int,
        args: Sequence[str] = (),
        *,
        port: int = 0,
        file_size_limit_bytes: int | None = None,
        start_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.capacity = str(capacity)
        self.args = list(args)
        self.file_size_limit_bytes = file_size_limit_bytes
        self.start_timeout_s = start_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.port = port
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._threads: list[threading.Thread] = []
        self._spawn()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _preexec(self) -> None:
        if self.file_size_limit_bytes is not None:
            lim = self.file_size_limit_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))

    def _spawn(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "kvstore",
            "node",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--dir",
            str(self.dir),
            "--capacity",
            self.capacity,
            *self.args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            preexec_fn=self._preexec,
        )
        err = threading.Thread(
            target=self._drain, args=(self.proc.stderr, self.stderr_lines), daemon=True
        )
        err.start()
        self._threads = [err]
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=10)
                err.join(timeout=5)
                raise StoreUnavailable(
                    f"node exited with {self.proc.returncode}: "
                    + " | ".join(self.stderr_lines[-5:])
                )
            self.stdout_lines.append(line.rstrip())
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                break
        else:
            self.kill()
            raise StoreUnavailable("node did not start in time")
        out = threading.Thread(
            target=self._drain, args=(self.proc.stdout, self.stdout_lines), daemon=True
        )
        out.start()
        self._threads.append(out)

    @staticmethod
    def _drain(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip())

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait (kill -9 if it hangs); returns the exit status."""
        if self.proc is None:
            return 0
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """``kill -9``: no shutdown path runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self._join()

    def restart(self) -> None:
        """Start again on the same port and directory (after ``kill`` or ``stop``)."""
        if self.alive():
            raise RuntimeError("node is still running")
        self._spawn()

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> NodeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
