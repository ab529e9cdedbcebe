"""Decode step time with the fused per-row ops (``kernels.fused``) against the torch forms,
in one process (issue 33 item 1: everything in a decode step that is not a linear or the
attention kernel).

``KERNELS_FUSED`` is read at every step, so the two variants share the model, the engine
and the process and run interleaved: per round and per batch size (1 and 8 requests of
``--prompt-tokens``-token random prompts), each variant generates 1 token and then
``--new-tokens`` + 1 tokens on fresh prompts; the difference over ``--new-tokens`` is the
milliseconds of one decode step (prefill cancels). The median over ``--rounds`` rounds is
printed per variant with the ratio torch / fused from the same run. ``--profile N`` then
prints a cProfile of N decode steps of one request with the fused ops (top by own time).

    python -m bench.bench_fused --model ~/.cache/kvengine/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from engine.thread_env import set_thread_env_defaults

set_thread_env_defaults(os.environ)  # as kvengine starts torch

import torch  # noqa: E402

from bench.harness import machine  # noqa: E402
from engine.connector.store_link import NullStoreLink  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.core.llm_engine import LLMEngine  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.kv.namespace import engine_namespace  # noqa: E402
from engine.model.loader import load_model  # noqa: E402
from engine.model.rope import RopeConfig, RotaryEmbedding  # noqa: E402
from kernels import fused  # noqa: E402

VARIANTS = ("torch", "fused")


def _prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _set_variant(name: str) -> None:
    if name == "torch":
        os.environ["KERNELS_FUSED"] = "torch"
    else:
        os.environ.pop("KERNELS_FUSED", None)


def step_ms(engine: LLMEngine, vocab: int, n: int, prompt: int, new: int, seed: int,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds of one decode step of ``n`` requests (a long minus a one-token run)."""
    def run(tokens: int, s: int) -> float:
        ps = _prompts(vocab, n, prompt, s)
        t = clock()
        engine.generate(ps, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
        return clock() - t
    one = run(1, seed)
    return (run(new + 1, seed + 1) - one) / new * 1e3


def profile(engine: LLMEngine, vocab: int, prompt: int, steps: int, fused_on: bool) -> str:
    """cProfile of ``steps`` decode steps of one request (the prefill runs before)."""
    _set_variant("fused" if fused_on else "torch")
    (ids,) = _prompts(vocab, 1, prompt, 99)
    seq = engine.add_request(ids, SamplingParams(max_new_tokens=steps + 2, ignore_eos=True))
    engine.step()  # the prefill (one chunk: the budget is 2 048) and the first token
    engine.step()  # one decode step, so the profile starts in steady state
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    while not seq.is_finished:
        engine.step()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def _us_per_call(fn: Callable[[], object], calls: int = 300) -> float:
    """CPU µs per call (one thread's ops: steadier than the wall clock on a loaded host;
    for the team column it is the whole process's, spin-waits included)."""
    fn()
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls * 1e6


def _op_cases(rows: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Per op on SmolLM2-135M's shapes (bfloat16, ``rows`` rows): (torch form, C op)."""
    hidden, inter, heads, kv_heads, dim = 576, 1536, 9, 3, 64
    c, t = fused.FUSED_OPS["c"], fused.TORCH_OPS
    x, r = torch.randn(rows, hidden).bfloat16(), torch.randn(rows, hidden).bfloat16()
    w = torch.rand(hidden).bfloat16()
    gu = torch.randn(rows, 2 * inter).bfloat16()
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim).bfloat16()
    rope = RotaryEmbedding(RopeConfig("default", 100_000.0), dim)
    cos, sin = rope(torch.arange(rows) + 500, torch.bfloat16)
    pools = torch.zeros(2, 64, 16, kv_heads, dim, dtype=torch.bfloat16)
    slots = torch.arange(rows) + 7

    def rope_call(o: fused.FusedOps) -> Callable[[], object]:
        return lambda: o.rope_write(qkv, heads, kv_heads, dim, cos, sin, None, None, 1e-5,
                                    False, pools[0], pools[1], slots, "torch")

    return {
        "add_rms_norm": (lambda: t.add_rms_norm(x, r, w, 1e-5, False),
                         lambda: c.add_rms_norm(x, r, w, 1e-5, False)),
        "rope_write": (rope_call(t), rope_call(c)),
        "silu · up": (lambda: t.gated_act(gu, False), lambda: fused.c_gated_act(gu, False)),
        "gelu-tanh · up": (lambda: t.gated_act(gu, True), lambda: fused.c_gated_act(gu, True)),
    }


def ops_table(rounds: int) -> str:
    """µs per call of each op, bfloat16: the torch forms, the C op on the calling thread,
    and the C op on the OpenMP team (every call parallel), interleaved."""
    lines = ["| op | rows | torch forms | C, 1 thread | C, OpenMP team | torch / C |",
             "|---|---|---|---|---|---|"]
    for rows in (1, 8, 512):
        for name, (torch_form, c_op) in _op_cases(rows).items():
            got: dict[str, list[float]] = {"torch": [], "c": [], "team": []}
            for _ in range(rounds):
                got["torch"].append(_us_per_call(torch_form))
                got["c"].append(_us_per_call(c_op))
                before = fused.set_parallel_min_elements(0)
                got["team"].append(_us_per_call(c_op))
                fused.set_parallel_min_elements(before)
            t, one, team = (statistics.median(got[k]) for k in ("torch", "c", "team"))
            lines.append(f"| {name} | {rows} | {t:.1f} µs | {one:.1f} µs | {team:.1f} µs | "
                         f"{t / min(one, team):.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a checkpoint directory (not for --ops)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds (median); 0 with --profile: the profile only")
    p.add_argument("--new-tokens", type=int, default=32, help="decode steps per timed run")
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens per prompt")
    p.add_argument("--batches", default="1,8", help="request counts, comma-separated")
    p.add_argument("--cpu-time", action="store_true",
                   help="time by the process's CPU seconds, not the wall clock: on a shared, "
                        "overloaded machine, with KVENGINE_THREADS=1, the steadier measure")
    p.add_argument("--ops", action="store_true",
                   help="only the per-op table (µs per call: torch forms, C, C on a team)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="then a cProfile of N decode steps at 1 request, torch forms and fused")
    a = p.parse_args(argv)
    if a.rounds < 0 or a.profile < 0:
        p.error("--rounds and --profile must not be negative")
    if a.new_tokens < 1 or a.prompt_tokens < 1 or a.prompt_tokens > 2048:
        p.error("--new-tokens must be positive, --prompt-tokens in 1..2048")
    batches = [int(x) for x in a.batches.split(",")]
    if a.ops:
        print(machine())
        print(ops_table(a.rounds))
        return 0
    if a.model is None:
        p.error("--model is required (except with --ops)")
    lm = load_model(a.model)
    vocab = lm.spec.vocab_size
    config = EngineConfig(pool_tokens=16 * 1024, max_batched_tokens=2048)
    engine = LLMEngine(lm.model, config,
                       NullStoreLink(engine_namespace(lm.spec, config.block_tokens)))
    print(machine())
    step_ms(engine, vocab, 1, a.prompt_tokens, 4, 0)  # warm-up (weights packed, threads up)
    results: dict[tuple[int, str], list[float]] = {}
    for r in range(a.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for n in batches:
            for name in order:
                _set_variant(name)
                ms = step_ms(engine, vocab, n, a.prompt_tokens, a.new_tokens, 1000 * r + 10 * n,
                             time.process_time if a.cpu_time else time.perf_counter)
                results.setdefault((n, name), []).append(ms)
        print(f"round {r + 1}: " + ", ".join(
            f"{n} req {v} {results[(n, v)][-1]:.1f} ms" for n in batches for v in VARIANTS),
            f"(load {os.getloadavg()[0]:.1f})", flush=True)
    clock = "CPU" if a.cpu_time else "wall"
    threads = os.environ.get("KVENGINE_THREADS", "default")
    if a.rounds:
        print(f"\n{clock} ms per decode step, median of {a.rounds} interleaved rounds "
              f"(prompt {a.prompt_tokens}, {a.new_tokens} steps, threads {threads}):")
        print("| requests | torch forms | fused | torch / fused |\n|---|---|---|---|")
        for n in batches:
            t = statistics.median(results[(n, "torch")])
            f = statistics.median(results[(n, "fused")])
            print(f"| {n} | {t:.2f} ms | {f:.2f} ms | {t / f:.2f}× |")
    if a.profile:
        for on in (False, True):
            print(f"cProfile, {a.profile} decode steps, 1 request, "
                  f"{'fused' if on else 'torch forms'}:")
            print(profile(engine, vocab, a.prompt_tokens, a.profile, on))
    _set_variant("fused")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
