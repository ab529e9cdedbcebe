"""Run ``vllm_run.py`` in vLLM's venv (``make vllm-venv``) from the project's tests.

vLLM cannot live in the project's venv (its pins clash), so its tests run it as a child
process of that venv's Python. Where the venv is missing, the tests skip, except where
``KVSTORE_REQUIRE_VLLM=1`` (``.ci/run`` sets it): on CI they must run.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
RUNNER = Path(__file__).with_name("vllm_run.py")
PROCESS_TIMEOUT_S = 420.0


def vllm_python() -> Path:
    if VLLM_PYTHON.exists():
        return VLLM_PYTHON
    why = f"{VLLM_PYTHON} missing: `make vllm-venv` builds vLLM's venv"
    if os.environ.get("KVSTORE_REQUIRE_VLLM") == "1":
        pytest.fail(why + " (KVSTORE_REQUIRE_VLLM=1: these tests must run)")
    pytest.skip(why)


@dataclass
class Output:
    tokens: list[int]
    num_cached_tokens: int


@dataclass
class Phase:
    outputs: list[Output]
    stats: dict[str, int]  # the connector's worker counters over the phase
    recovered: int  # vLLM's recoveries from a failed load in the phase


class VllmRun:
    """One started ``vllm_run.py``; ``result()`` waits and returns each phase's outputs."""

    def __init__(self, spec: dict[str, Any], workdir: Path, name: str,
                 threads: int = 2) -> None:
        self.name = name
        path = workdir / f"{name}.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        self.log_path = workdir / f"{name}.log"
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": str(REPO),
            # vLLM in this one process: an embedded store may be opened by one process only.
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OMP_NUM_THREADS": str(threads),
            "VLLM_LOGGING_LEVEL": "WARNING",
        })
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen([str(vllm_python()), str(RUNNER), str(path)], cwd=REPO,
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def result(self) -> list[Phase]:
        try:
            rc = self.proc.wait(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        finally:
            self._log.close()
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        if rc != 0 or not lines:
            tail = "\n".join(text.splitlines()[-40:])
            raise AssertionError(f"vLLM run {self.name} exited {rc}:\n{tail}")
        got = json.loads(lines[-1].removeprefix("RESULT "))
        return [Phase([Output(**o) for o in outs], stats, recovered) for outs, stats, recovered
                in zip(got["phases"], got["stats"], got["recovered"], strict=True)]

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self._log.closed:
            self._log.close()
