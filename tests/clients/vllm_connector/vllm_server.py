"""``vllm serve`` (vLLM's OpenAI server, from vLLM's venv) with the connector on a daemon,
as a child process on a free loopback port; ``stop()`` ends it (SIGTERM, then SIGKILL).

Float32 (vLLM and ``kvengine`` share blocks only in one dtype), eager, a 2,048-token
context; ``kv_role`` is vLLM's (``kv_producer``, ``kv_consumer``, ``kv_both``). vLLM's log
goes to ``log_path`` (read it when a start fails)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx2 as httpx

from tests.clients.vllm_connector.vllm_procs import REPO, vllm_python

START_TIMEOUT_S = 600.0  # ~1 min on an idle 2-core machine; much more under load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    def __init__(self, model_dir: Path, name: str, kv_role: str, store: str, log_dir: Path,
                 extra_config: dict[str, object] | None = None) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.log_path = log_dir / f"vllm-{kv_role}-{self.port}.log"
        config = {"kv_connector": "KVStoreConnector",
                  "kv_connector_module_path": "clients.vllm_connector.connector",
                  "kv_role": kv_role,
                  "kv_connector_extra_config": {"store": store, **(extra_config or {})}}
        env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1",
               "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
             "--model", str(model_dir), "--served-model-name", name, "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
             "--max-model-len", "2048", "--max-num-batched-tokens", "2048", "--seed", "0",
             "--enable-prompt-tokens-details",
             "--kv-transfer-config", json.dumps(config)],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its engine-core and worker processes go with it

    def wait_ready(self, deadline_s: float) -> None:
        while time.monotonic() < deadline_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vllm serve never answered /health: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
