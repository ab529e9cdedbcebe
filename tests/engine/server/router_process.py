"""Run vllm-router (the real Rust router, from its PyPI wheel, in a venv of its own) in
front of ``kvengine serve`` replicas on a free loopback port.

The router's venv is ``$KVENGINE_ROUTER_VENV``, else ``.venv-router`` at the repository's
root (``make setup`` creates it). Absent, the tests that need it skip with that reason —
except where ``KVENGINE_REQUIRE_ROUTER=1`` (CI), where they fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.engine.server.serve_process import REPO


def router_python() -> Path:
    venv = Path(os.environ.get("KVENGINE_ROUTER_VENV") or REPO / ".venv-router")
    python = venv / "bin" / "python"
    if not python.is_file():
        reason = f"vllm-router's venv {venv} is absent (make setup creates it)"
        if os.environ.get("KVENGINE_REQUIRE_ROUTER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RouterProcess:
    def __init__(self, workers: list[str], policy: str = "round_robin",
                 extra: tuple[str, ...] = (), start_timeout_s: float = 60.0,
                 decode: list[str] | None = None) -> None:
        """``decode`` given: vLLM's PD mode, ``workers`` being the prefill replicas."""
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        if decode is None:
            targets = ["--worker-urls", *workers]
        else:
            targets = ["--vllm-pd-disaggregation"]
            for url in workers:
                targets += ["--prefill", url]
            for url in decode:
                targets += ["--decode", url]
        cmd = [str(router_python()), "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
               "--port", str(self.port), *targets, "--policy", policy,
               "--health-check-interval-secs", "1",
               # its metrics exporter binds a fixed port by default: one per router here
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
               *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited: {self.proc.stderr.read()[-2000:]}"
                                   if self.proc.stderr else "vllm-router exited")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("vllm-router never answered /health")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
