"""What keyed prefix keys cost (issue #33 item 5): ``chain_keys`` with ``xxh3_128`` against
``blake2b_128`` keyed with a 32-byte deployment secret, per block and per token, and as a
share of a prefill step of SmolLM2-135M-Instruct (one 2,048-token step, the engine's default
budget, cold, no store) measured in the same run, after the hashing rounds.

Run: ``.venv/bin/python -m bench.bench_prefix_hash [--tokens 16384] [--runs 5] [--json]``
(the prefill part needs the model: ``kvengine fetch-model smollm2-135m-instruct``; without
it only the hashing figures are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import machine, median_interleaved, timed
from kvstore.keys import Namespace, chain_keys
from kvstore.prefix_key import PrefixHash

BLOCK = 64
STEP_TOKENS = 2048
MODEL = Path(os.environ.get("KVENGINE_CACHE_DIR", Path.home() / ".cache" / "kvengine")) / (
    "models/smollm2-135m-instruct"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384, help="prompt tokens hashed per run")
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()
    xxh3 = Namespace("bench", "r", "bfloat16", "mha", tuple(range(30)), 3, 64, BLOCK)
    blake = PrefixHash("blake2b_128", os.urandom(32)).apply(xxh3)
    tokens = np.random.default_rng(1).integers(0, 49_152, args.tokens, dtype=np.int64)
    repeat = max(1, 200_000 // args.tokens)
    cases = {
        "xxh3_128": lambda: timed(lambda: chain_keys(xxh3, tokens), repeat),
        "blake2b_128": lambda: timed(lambda: chain_keys(blake, tokens), repeat),
    }
    # Hashing first, its two cases interleaved; the prefill after, on its own: torch's
    # worker threads spin for a while after each step and would slow a hash timed next.
    med = median_interleaved(cases, args.runs)
    step = None
    if (MODEL / "config.json").exists():
        from bench.bench_engine import Bench

        bench = Bench(MODEL, pool_tokens=4 * STEP_TOKENS, budget=STEP_TOKENS,
                      store_root=Path(tempfile.gettempdir()))
        step = bench.prompt(STEP_TOKENS, seed=3)

        def prefill_s() -> float:
            with bench.engine() as eng:
                return bench.run_one(eng, step).stats.ttft_s

        med.update(median_interleaved({"prefill_step": prefill_s}, 3))
    blocks = args.tokens // BLOCK
    out: dict[str, object] = {"machine": machine(), "load_average_before": load_before}
    for alg in ("xxh3_128", "blake2b_128"):
        out[f"{alg}_us_per_block"] = med[alg] / blocks * 1e6
        out[f"{alg}_ns_per_token"] = med[alg] / args.tokens * 1e9
    out["blake2b_over_xxh3"] = med["blake2b_128"] / med["xxh3_128"]
    if step is not None:
        per_token_s = med["prefill_step"] / STEP_TOKENS
        out["prefill_step_s"] = med["prefill_step"]
        out["prefill_us_per_token"] = per_token_s * 1e6
        for alg in ("xxh3_128", "blake2b_128"):
            out[f"{alg}_share_of_prefill"] = (med[alg] / args.tokens) / per_token_s
        out["blake2b_added_share_of_prefill"] = (
            (med["blake2b_128"] - med["xxh3_128"]) / args.tokens / per_token_s
        )
    out["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:36} {v:.6g}" if isinstance(v, float) else f"{k:36} {v}")


if __name__ == "__main__":
    main()
