"""Bounded replay vs exact reuse vs cold on the small hybrid checkpoint (issue 12).

For each context ``N``: a prompt of ``N`` cached tokens plus ``--new-tokens`` new ones.
Cold: the whole prompt prefilled from nothing. Exact reuse (``--cache-all-layers``): the
store holds every layer (full and sliding layers in two namespaces; the sliding ones are
loaded only for the last window's blocks) and a hit computes only the new tokens. Bounded
(the default keep): the store holds the full-attention layers and, at the committed end,
the window tail (the sliding layers of the blocks its last window reaches); the hit lands
there, as a session's next turn does, so it loads the tail and computes only the new
tokens. ``--no-tail`` adds, beside each bounded mode, the same mode with the tail absent
(``-notail`` cases): a hit anywhere else, which recomputes ``keep`` + new tokens
(``--keeps``: the default keep, and others beside it, a keep below the default measured
forced). Each hit is served from the embedded store's DRAM, then,
the store reopened on the same directory (empty DRAM), from its SSD. Per case: TTFT, the
tokens computed and replayed (counted by the engine), the bytes loaded from the store, and
the bytes per token the store keeps. Ratios are against the same run's figures.

The store is filled once per ``N`` by one cold prefill of the ``N`` cached tokens in exact
mode; bounded mode's namespaces get the same full-attention blocks and the tail's sliding
blocks copied over (a bounded fill would store exactly those bytes: a cold prefill's).
Run alone, on an otherwise idle machine::

    python -m bench.bench_replay --sizes 4096,16384 --new-tokens 1024
    python -m bench.bench_replay --model DIR --sizes 31744 --keeps default,140
    python -m bench.bench_replay --model DIR --sizes 15360 --no-tail --repeats 3 --tiers dram

``--ab-cut`` adds, beside each bounded mode, the same mode with its replayed tokens run
through every layer (``EngineConfig.replay_row_cut=False``; ``-nocut`` cases), and prints
each bounded mode's TTFT over its uncut twin: the saving of stopping replayed tokens at the
last sliding layer (``engine.core.row_cut``), measured in one run. Rounds alternate the
order of the bounded modes, so neither twin always runs first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.engine_args import add_engine_args, model_and_store_root
from bench.harness import machine
from bounded_replay import default_keep_tokens
from bounded_replay.errors import ReplayError
from engine.connector.store_link import KVStoreLink, NullStoreLink, StoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.kv.namespace import engine_namespaces
from engine.model.loader import LoadedModel, load_model
from kvstore.embedded import open_embedded
from kvstore.keys import Namespace, chain_keys
from kvstore.tier import CommitResult, KVStore

ONE_TOKEN = SamplingParams(max_new_tokens=1, ignore_eos=True)


def parse_keeps(text: str, layer_windows: list[int | None] | tuple[int | None, ...]
                ) -> tuple[int, ...]:
    """``--keeps`` as token counts, in the order given, each once: ``default`` is the
    largest window + 12; a count must be >= 1 (keep 0 is exact mode, measured anyway)."""
    keeps: list[int] = []
    for word in text.split(","):
        word = word.strip()
        if word == "default":
            keep = default_keep_tokens(layer_windows)
        elif word.isdigit() and int(word) >= 1:
            keep = int(word)
        else:
            raise ReplayError(f"--keeps takes 'default' or token counts >= 1, got {word!r}")
        if keep < 1:
            raise ReplayError("--keeps default: the model has no sliding layers to replay")
        if keep not in keeps:
            keeps.append(keep)
    return tuple(keeps)


def mode_name(keep: int, default_keep: int) -> str:
    """``bounded`` for the default keep (the name earlier runs' JSON used), else
    ``bounded-kN``; no ``_`` in it: a case is ``<mode>_<tier>``."""
    return "bounded" if keep == default_keep else f"bounded-k{keep}"


class ReadOnlyLink(KVStoreLink):
    """A measured run loads but does not commit: the next case must hit exactly the
    filled prefix, not the blocks an earlier case computed."""

    def commit(self, keys: Any, payloads: Any, timeout_s: float,
               ns: Namespace | None = None) -> CommitResult:
        return CommitResult(dropped=len(payloads))


class TaillessLink(ReadOnlyLink):
    """A ``-notail`` case: the window tail is absent (its sibling namespaces are null), so
    the hit replays."""

    def sibling(self, ns: Namespace) -> StoreLink:
        return NullStoreLink(ns)


class Bench:
    def __init__(self, lm: LoadedModel, pool_tokens: int, budget: int, store_root: Path,
                 dram_bytes: int, ssd_bytes: int, keeps: tuple[int, ...] = (),
                 ab_cut: bool = False, no_tail: bool = False) -> None:
        self.lm = lm
        default = default_keep_tokens(lm.spec.layer_windows)
        self.configs = {
            "exact": EngineConfig(pool_tokens=pool_tokens, max_batched_tokens=budget,
                                  cache_all_layers=True),
        }
        # opted into (exact is the default): the safe keep, largest window + 12, unless
        # --keeps names others (below it, forced: issue 30's keep 140)
        for keep in keeps or (default,):
            cfg = EngineConfig(pool_tokens=pool_tokens, max_batched_tokens=budget,
                               replay_keep_tokens=keep, replay_force=keep < default)
            self.configs[mode_name(keep, default)] = cfg
            if ab_cut:
                self.configs[mode_name(keep, default) + "-nocut"] = replace(
                    cfg, replay_row_cut=False)
            if no_tail:
                self.configs[mode_name(keep, default) + "-notail"] = cfg
        self.modes = tuple(self.configs)
        self.ns = {m: engine_namespaces(lm.spec, c.block_tokens,
                                        c.replay_policy(lm.spec.layer_windows))
                   for m, c in self.configs.items()}
        self.store_root = store_root
        self.dram_bytes = dram_bytes
        self.ssd_bytes = ssd_bytes

    def engine(self, mode: str, store: KVStore | None = None, *, fill: bool = False
               ) -> LLMEngine:
        ns = self.ns[mode].primary
        kind = KVStoreLink if fill else TaillessLink if mode.endswith("-notail") \
            else ReadOnlyLink
        link: StoreLink = (NullStoreLink(ns) if store is None
                           else kind(store, ns, "embedded", close_store=False))
        return LLMEngine(self.lm.model, self.configs[mode], link)

    def open_store(self, directory: Path) -> KVStore:
        return open_embedded(dram_bytes=self.dram_bytes, ssd_dir=str(directory),
                             ssd_capacity_bytes=self.ssd_bytes)

    def prompt(self, n: int, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.lm.spec.vocab_size, (n,), generator=g).tolist()

    @staticmethod
    def run_one(eng: LLMEngine, ids: list[int]) -> Sequence:
        (seq,) = eng.generate([ids], ONE_TOKEN)
        return seq

    def copy_layers(self, store: KVStore, tokens: list[int], mode: str) -> None:
        """Exact mode's full-attention blocks, and the sliding blocks of the window tail at
        the end of ``tokens``, committed under a bounded mode's namespaces."""
        src, dst = self.ns["exact"], self.ns[mode]
        if src.sliding is None or dst.sliding is None:
            raise RuntimeError("a hybrid model has a sliding namespace in either mode")
        end = len(tokens) // src.primary.block_tokens
        tail = dst.tail_blocks if end >= dst.tail_blocks else end
        for a, b, first in ((src.primary, dst.primary, 0), (src.sliding, dst.sliding, end - tail)):
            if tuple(a.cached_layers) != tuple(b.cached_layers):
                raise RuntimeError("exact and bounded namespaces hold different layers")
            src_keys, dst_keys = chain_keys(a, tokens), chain_keys(b, tokens)
            rows = torch.empty((end - first, *a.payload_shape), dtype=self.lm.spec.dtype)
            store.register(b)
            got = store.get_into(a, src_keys[first:], rows)
            if got != end - first:
                raise RuntimeError(f"the fill stored {got} of {end - first} blocks")
            store.commit(b, dst_keys, {first + i: rows[i] for i in range(got)})

    def case(self, eng: LLMEngine, ids: list[int]) -> dict[str, Any]:
        cpu0 = time.process_time()
        seq = self.run_one(eng, ids)
        cpu_s = time.process_time() - cpu0
        s = seq.stats
        return {"ttft_s": s.ttft_s, "cpu_s": cpu_s, "hit_tokens": dict(s.hit_tokens),
                "computed_tokens": s.computed_tokens, "replayed_tokens": s.replayed_tokens,
                "loaded_bytes": eng.store_counters().get("loaded_bytes_total", 0),
                "stored_bytes_per_token": eng.stored_bytes_per_token(len(ids))}

    def order(self, reverse: bool) -> tuple[str, ...]:
        """Exact mode, then the bounded modes, in reverse with ``reverse``."""
        return (self.modes[0], *(self.modes[:0:-1] if reverse else self.modes[1:]))

    def round(self, n: int, new: int, seed: int, cases: str, *, repeats: int = 1,
              tiers: tuple[str, ...] = ("dram", "ssd"), flip: bool = False
              ) -> list[dict[str, dict[str, Any]]]:
        """One prompt: cold, the fill, then ``repeats`` times every mode's hit from DRAM,
        then ``repeats`` times from SSD; one sample per repeat (cold in the first only).
        The bounded modes' order alternates between repeats (``flip``: starting reversed),
        so neither of two twins always runs first."""
        ids = self.prompt(n + new, seed)
        orders = [self.order(flip != (r % 2 == 1)) for r in range(repeats)]
        out: list[dict[str, dict[str, Any]]] = [{} for _ in range(repeats)]
        if cases in ("all", "cold"):
            with self.engine("exact") as eng:
                out[0]["cold"] = self.case(eng, ids)
        if cases == "cold":
            return out[:1]
        directory = Path(tempfile.mkdtemp(dir=self.store_root, prefix="bench-replay-"))
        try:
            store = self.open_store(directory)
            try:
                with self.engine("exact", store, fill=True) as eng:  # N tokens, cold
                    self.run_one(eng, ids[:n])
                copied: set[Namespace] = set()
                for mode in self.modes[1:]:  # a -nocut twin shares its mode's namespace
                    if self.ns[mode].primary not in copied:
                        self.copy_layers(store, ids[:n], mode)
                        copied.add(self.ns[mode].primary)
                store.flush()
                for r, order in enumerate(orders if "dram" in tiers else ()):
                    for mode in order:
                        with self.engine(mode, store) as eng:
                            out[r][f"{mode}_dram"] = self.case(eng, ids)
            finally:
                store.close()
            for r, order in enumerate(orders if "ssd" in tiers else ()):
                for mode in order:  # reopened: an empty DRAM tier, reads from the SSD
                    store = self.open_store(directory)
                    try:
                        with self.engine(mode, store) as eng:
                            out[r][f"{mode}_ssd"] = self.case(eng, ids)
                    finally:
                        store.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return out


def print_twin(n: int, k: str, twin: str, med: dict[str, float],
               runs: list[dict[str, dict[str, Any]]]) -> None:
    """A bounded case over its twin (``-nocut``, ``-notail``) from the same fills."""
    per = [run[k]["ttft_s"] / run[twin]["ttft_s"] for run in runs]
    print(f"# {n}: {k} / {twin} = {med[k] / med[twin]:.3f} (medians), "
          f"median of the per-sample ratios {statistics.median(per):.3f}; "
          f"per sample {', '.join(f'{x:.3f}' for x in per)}", flush=True)
    # CPU seconds of the process (one torch thread): what the step computed, less swayed
    # than the wall clock by other jobs on an oversubscribed machine.
    cpu = [run[k]["cpu_s"] / run[twin]["cpu_s"] for run in runs]
    print(f"# {n}: {k} / {twin}, CPU seconds: median of the per-sample ratios "
          f"{statistics.median(cpu):.3f}; per sample "
          f"{', '.join(f'{x:.3f}' for x in cpu)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, sizes="4096,16384", rounds=1, new_tokens=1024,
                    sizes_help="cached context tokens", new_tokens_help="new prompt tokens per hit")
    p.add_argument("--cases", choices=("all", "cold", "hits"), default="all",
                   help="cold and hits of one size in separate commands (64 K: each runs "
                        "a cold prefill of minutes)")
    p.add_argument("--dram", type=int, default=2 << 30, help="store DRAM tier bytes")
    p.add_argument("--ssd", type=int, default=8 << 30, help="store SSD tier bytes")
    p.add_argument("--keeps", default="default",
                   help="bounded modes' keeps, comma-separated: 'default' (largest window "
                        "+ 12: 524 on Gemma 3) and token counts; one below the default is "
                        "measured forced (e.g. default,140: the window-blind keep of issue 12)")
    p.add_argument("--repeats", type=int, default=1,
                   help="hits of each mode per fill (one fill per round): samples interleaved "
                        "across the modes, the median over rounds × repeats")
    p.add_argument("--tiers", default="dram,ssd", help="store tiers hit: dram, ssd or both")
    p.add_argument("--ab-cut", action="store_true",
                   help="also run each bounded mode with its replayed tokens through every "
                        "layer (-nocut cases) and print bounded / bounded-nocut")
    p.add_argument("--no-tail", action="store_true",
                   help="also run each bounded mode with the window tail absent (-notail "
                        "cases: the hit replays keep tokens) and print bounded / "
                        "bounded-notail")
    args = p.parse_args(argv)
    tiers = tuple(t.strip() for t in args.tiers.split(","))
    if args.repeats < 1 or not tiers or not set(tiers) <= {"dram", "ssd"}:
        p.error("--repeats must be >= 1 and --tiers name dram and/or ssd")
    model_dir, store_root = model_and_store_root(args, hybrid=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    lm = load_model(model_dir)
    try:
        keeps = parse_keeps(args.keeps, lm.spec.layer_windows)
    except ReplayError as e:
        p.error(str(e))
    pool = (max(sizes) + args.new_tokens) * 2 + 4096
    b = Bench(lm, pool, args.budget, store_root, args.dram, args.ssd, keeps, args.ab_cut,
              args.no_tail)
    keep = ", ".join(str(b.configs[m].replay_policy(lm.spec.layer_windows).keep_tokens)
                     for m in b.modes[1:])
    print(f"# bench_replay on {model_dir.name}: {machine()}, torch threads "
          f"{torch.get_num_threads()}, budget {args.budget} tokens/step, keep {keep}, "
          f"{args.new_tokens} new tokens, {args.rounds} round(s) × {args.repeats} "
          f"repeat(s) (median), tiers {','.join(tiers)}")
    with b.engine("exact") as eng:  # warm-up: first-call costs are not the steady state
        b.run_one(eng, b.prompt(256, 1))
    print("| context | case | TTFT s | computed | replayed | loaded MiB | stored B/token "
          "| cold/case | case/exact (same tier) |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    samples: dict[int, list[dict[str, dict[str, float]]]] = {}
    for n in sizes:
        runs = [sample for r in range(args.rounds)
                for sample in b.round(n, args.new_tokens, n + r, args.cases,
                                      repeats=args.repeats, tiers=tiers, flip=r % 2 == 1)]
        samples[n] = [{k: {"ttft_s": v["ttft_s"], "cpu_s": v["cpu_s"]} for k, v in run.items()}
                      for run in runs]
        med = {k: statistics.median(run[k]["ttft_s"] for run in runs if k in run)
               for k in runs[0]}
        for k, first in runs[0].items():
            tier = k.rsplit("_", 1)[-1]
            exact = med.get(f"exact_{tier}")
            cold = med.get("cold")
            row = {"context_tokens": n, "case": k, **first, "ttft_s": med[k],
                   "cold_over_case": cold / med[k] if cold else None,
                   "case_over_exact": med[k] / exact if exact else None}
            rows.append(row)
            vs_exact = "" if exact is None else f"{row['case_over_exact']:.2f}"
            vs_cold = "" if cold is None else f"{row['cold_over_case']:.1f}×"
            print(f"| {n} | {k} | {med[k]:.2f} | {first['computed_tokens']} | "
                  f"{first['replayed_tokens']} | {first['loaded_bytes'] / 2**20:.1f} | "
                  f"{first['stored_bytes_per_token']:.0f} | {vs_cold} | "
                  f"{vs_exact} |", flush=True)
        for k in med:
            exact_k = f"exact_{k.rsplit('_', 1)[-1]}"
            if k != "cold" and k != exact_k:
                per = [run[k]["ttft_s"] / run[exact_k]["ttft_s"] for run in runs]
                cpu = [run[k]["cpu_s"] / run[exact_k]["cpu_s"] for run in runs]
                print(f"# {n}: {k} / {exact_k}: median of the per-sample ratios "
                      f"{statistics.median(per):.3f} (CPU seconds "
                      f"{statistics.median(cpu):.3f}); per sample "
                      f"{', '.join(f'{x:.3f}' for x in per)} (CPU "
                      f"{', '.join(f'{x:.3f}' for x in cpu)})", flush=True)
            for twin in (k.replace("_", "-nocut_", 1), k.replace("_", "-notail_", 1)):
                if twin != k and twin in med:  # "cold" has no "_", hence no twin
                    print_twin(n, k, twin, med, runs)
    if args.json:
        args.json.write_text(json.dumps({"keep_tokens": list(keeps), "rows": rows,
                                         "rounds": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
