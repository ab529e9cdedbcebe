"""Run ``kvengine serve`` as a child process on a free loopback port (it binds port 0 and
prints ``listening on HOST:PORT``), and stop it (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2 as httpx

REPO = Path(__file__).resolve().parents[3]


class ServeProcess:
    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 start_timeout_s: float = 120.0, listen_host: str = "127.0.0.1") -> None:
        """``listen_host``: the address to bind (port 0); the tests reach it on loopback."""
        cmd = [sys.executable, "-m", "engine.cli", "serve", "--listen", f"{listen_host}:0",
               *args]
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []  # what it printed up to "listening on"
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + start_timeout_s
        self.port = 0
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=10)
                raise RuntimeError(f"kvengine serve exited with {self.proc.returncode}: "
                                   f"{' | '.join(self.stderr_lines[-5:])}")
            self.stdout_lines.append(line.rstrip())
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                break
        if not self.port:
            self.stop()
            raise RuntimeError("kvengine serve did not start in time")
        self.base_url = f"http://127.0.0.1:{self.port}"
        # The socket is bound before uvicorn serves: wait until it answers.
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("kvengine serve never answered /health")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip())

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``/metrics``, e.g. ``metric("kvengine_requests_total",
        'finish_reason="abort"')``: 0 for a label set not seen yet, but a name of no
        metric the server declares is an error (a misspelt name must not read 0)."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        want = f"{name}{{{labels}}}" if labels else name
        families = []
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
            if line.startswith("# TYPE "):
                families.append(line.split()[2])
        suffixes = ("", "_total", "_count", "_sum", "_bucket", "_created")
        if not any(name == f + x for f in families for x in suffixes):
            raise KeyError(f"{name}: no such metric in /metrics")
        return 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._drainer.join(timeout=10)  # the process is gone: its stderr ends; all of it read
        return self.proc.returncode

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
