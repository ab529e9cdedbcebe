"""Agent traces through the served engine (issue 13, item 5): one kv-cache-tester slice
replayed by ``kvengine bench-serve`` through ``kvengine serve --kv-store none`` and through
``--kv-store embedded``, the same pool (well below the slice's working set, so hits beyond
it can only come from the store). Prints TTFT p50/p99 of each and their ratio, and the
measured token hit rate against the simulator's prediction for the same tiers.

The model is ``small`` (random weights, made in a temporary directory; ``--preset tiny``
for a quick look). The slice: the first 8 requests of 8 sessions, 64 requests, at k = 4
tokens a trace block, so prompts are 1.4-7 K tokens (a miss costs seconds of prefill, far
above the per-request cost of the server) and its distinct blocks are ~25 K tokens; the
pool is 8 K tokens (a third of that, one long prompt and a short one), with all 8 sessions
in flight, so a session's blocks are gone from the pool by its next turn. Each
configuration is started fresh (empty pool and store) per round; rounds interleave the
two and the figures are medians over rounds. Run alone::

    .venv/bin/python -m bench.bench_serve
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import machine
from engine.model.make_model import make_model
from engine.server.bench_serve import (
    Target,
    predict,
    replay,
    report,
    served_order,
)
from engine.server.scaled_requests import load_sessions

REPO = Path(__file__).resolve().parents[1]
# Sessions whose first turns do not start with a re-written context (a second turn mostly
# new): their later turns add a median of ~15 blocks, as agent sessions do.
SLICE = ("trace_0001.json", "trace_0013.json", "trace_0081.json", "trace_0115.json",
         "trace_0126.json", "trace_0137.json", "trace_0171.json", "trace_0193.json")


def spawn(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--listen",
                             "127.0.0.1:0", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, **env})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"kvengine serve did not start: {line!r}")
    url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
    target = Target(url, None)
    for _ in range(600):
        try:
            target.get_json("/health")
            break
        except Exception:
            time.sleep(0.1)
    return proc, url


def one(model: Path, store: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = {"KVENGINE_CACHE_DIR": str(work / "cache")}
    kv = "none" if store == "none" else f"embedded:{tempfile.mkdtemp(dir=work)}"
    proc, url = spawn(["--model", str(model), "--kv-store", kv, "--block-tokens", str(a.k),
                       "--pool-tokens", str(a.pool_tokens), "--no-cache-generated",
                       "--dram", a.dram, "--ssd-capacity", a.ssd,
                       "--max-batched-tokens", str(a.max_batched_tokens)], env)
    try:
        target = Target(url, None)
        info = target.get_json("/v1/models")["data"][0]
        meta = info["kvengine"]
        sessions = load_sessions(a.paths, a.k, meta["vocab_size"], 16, None,
                                 a.requests_per_session)
        block_bytes = meta["block_bytes"]
        from kvstore.units import parse_size

        dram = 0 if store == "none" else parse_size(a.dram) // block_bytes
        ssd = 0 if store == "none" else parse_size(a.ssd) // block_bytes
        pred = predict(sessions, a.k, meta["pool_tokens"], dram, ssd)
        rep = replay(target, info["id"], sessions, 1, a.concurrency, progress=False)
        served = predict(sessions, a.k, meta["pool_tokens"], dram, ssd, served_order(rep))
        out = report(rep, pred, served)
        out["outcomes"] = [{"session": o.session, "index": o.index,
                            "prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens,
                            "hit_tokens": o.hit_tokens, "ttft_s": o.ttft_s, "parts": o.parts}
                           for o in sorted(rep.outcomes, key=lambda o: o.sent_s)]
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=os.environ.get("KVSTORE_TRACES_DIR",
                                                      str(REPO.parent / "shared" / "traces")))
    p.add_argument("--slice", default=",".join(SLICE),
                   help="kv-cache-tester session files (comma-separated names)")
    p.add_argument("--k", type=int, default=4, help="tokens per trace block")
    p.add_argument("--pool-tokens", type=int, default=8192)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--requests-per-session", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8, help="sessions in flight")
    p.add_argument("--dram", default="512MiB")
    p.add_argument("--ssd", default="1GiB")
    p.add_argument("--stores", default="none,embedded",
                   help="configurations to run, comma-separated (none, embedded)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=280.0,
                   help="start no round that would end past this (keep a bench under 5 min)")
    p.add_argument("--preset", default="small", choices=("tiny", "small"),
                   help="the model made for the run (random weights)")
    p.add_argument("--model", default=None, help="an existing checkpoint instead")
    p.add_argument("--dump", default=None, metavar="FILE",
                   help="write each request's outcome (last round) to FILE as JSON")
    a = p.parse_args()
    a.paths = [str(Path(a.traces) / "kv-cache-tester" / n) for n in a.slice.split(",")]
    stores = a.stores.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = (Path(a.model) if a.model
                 else make_model("qwen3", a.preset, work / f"{a.preset}-qwen3").path)
        runs: dict[str, list[dict[str, Any]]] = {store: [] for store in stores}
        started = time.monotonic()
        for rnd in range(a.rounds):
            took = time.monotonic() - started
            if rnd and took / rnd * (rnd + 1) > a.budget_s:
                print(f"stopping after {rnd} rounds: another would pass --budget-s",
                      flush=True)
                break
            for store in stores:
                runs[store].append(one(model, store, a, work))
                r = runs[store][-1]
                print(f"{store:9s} ttft p50 {r['ttft_s']['p50'] * 1e3:8.1f} ms  p99 "
                      f"{r['ttft_s']['p99'] * 1e3:8.1f} ms  hit {r['token_hit_rate']:.4f} "
                      f"(predicted {r['predicted']['token_hit_rate']:.4f})  "
                      f"{r['requests']} req, {r['errors']} errors, {r['wall_s']:.0f} s",
                      flush=True)

    def med(store: str, *path: str) -> float:
        vals = []
        for r in runs[store]:
            v: Any = r
            for key in path:
                v = v[key]
            vals.append(float(v))
        return statistics.median(vals)

    out = {
        "machine": machine(),
        "slice": a.slice.split(","), "k": a.k, "model": a.model or a.preset,
        "pool_tokens": a.pool_tokens,
        "requests_per_session": a.requests_per_session, "concurrency": a.concurrency,
        "rounds": a.rounds,
        **{store: {"ttft_p50_s": med(store, "ttft_s", "p50"),
                   "ttft_p90_s": med(store, "ttft_s", "p90"),
                   "ttft_p99_s": med(store, "ttft_s", "p99"),
                   "token_hit_rate": med(store, "token_hit_rate"),
                   "predicted_token_hit_rate": med(store, "predicted", "token_hit_rate"),
                   "predicted_trace_order": med(store, "predicted_trace_order",
                                                "token_hit_rate"),
                   "hit_rate_by_tier": runs[store][-1]["hit_rate_by_tier"],
                   "predicted_by_tier": runs[store][-1]["predicted"]["hit_rate_by_tier"],
                   "ttft_parts_mean_s": {k: v["mean"] for k, v in
                                         runs[store][-1]["ttft_parts_s"].items()},
                   "requests": runs[store][-1]["requests"]}
           for store in runs},
    }
    if "none" in runs and "embedded" in runs:
        for q in ("p50", "p90", "p99"):
            out[f"ttft_{q}_ratio_none_over_embedded"] = (out["none"][f"ttft_{q}_s"]
                                                         / out["embedded"][f"ttft_{q}_s"])
    print(json.dumps(out, indent=1))
    if a.dump:
        Path(a.dump).write_text(json.dumps({s: r[-1]["outcomes"] for s, r in runs.items()}))


if __name__ == "__main__":
    main()
