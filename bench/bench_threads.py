"""Which OpenMP wait policy the engine's two-thread team should run with (issue 33 item 2).

torch's CPU ops run on libgomp's team; between two ops its worker threads spin
(``GOMP_SPINCOUNT`` iterations by default) before they sleep, which is free on idle cores
and ruinous when other processes want them: the spinning worker holds a core the
descheduled one needs, and every op's barrier waits for it. libgomp reads these variables
once, when torch loads it, so each policy runs in a fresh process (``--worker``), with:

- ``default``: no OpenMP variable set, ``KVENGINE_THREADS`` unset (both cores);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (workers sleep at once);
- ``spin-10k``: ``GOMP_SPINCOUNT=10000`` (a short spin, then sleep; what ``kvengine``'s
  entry point sets unless a wait policy is already set);
- ``1-thread``: ``KVENGINE_THREADS=1`` (no team at all).

Cases per process (one engine, SmolLM2-135M-Instruct bf16 unless ``--model``): cold prefill
tokens/s of one ``--prompt-tokens`` prompt, decode tokens/s of 1 and of 8 requests.
``--rounds`` rounds, the policies' processes interleaved in each (the order rotates), the
median per case and policy, its ratio to ``default`` from the same run, and the load
average (other sessions share the cores)::

    nice -n 10 python -m bench.bench_threads --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KVENGINE_THREADS",
            "OMP_PROC_BIND", "OMP_PLACES")
POLICIES: dict[str, dict[str, str]] = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin-10k": {"GOMP_SPINCOUNT": "10000"},
    "1-thread": {"KVENGINE_THREADS": "1"},
}


def worker(args: argparse.Namespace) -> int:
    # torch (and libgomp with it) loads only here, after the parent chose the environment.
    import torch

    from bench.bench_deterministic import _engine, _prompt, decode_rate, prefill_rate
    from engine.model.loader import load_model

    lm = load_model(args.model, dtype="bfloat16", progress=False)
    vocab, r = lm.spec.vocab_size, args.seed
    eng = _engine(lm, deterministic=False)
    try:
        prefill_rate(eng, _prompt(64, 999, vocab))  # warm-up
        out = {
            "prefill": prefill_rate(eng, _prompt(args.prompt_tokens, r, vocab)),
            "decode_1": decode_rate(eng, [_prompt(args.decode_prompt_tokens, 50 + r, vocab)],
                                    args.new_tokens),
            "decode_8": decode_rate(eng, [_prompt(args.decode_prompt_tokens, 60 + r * 8 + i,
                                                  vocab) for i in range(8)], args.new_tokens),
            "threads": torch.get_num_threads(),
        }
    finally:
        eng.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def run_policy(name: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(POLICIES[name], PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "bench.bench_threads", "--worker", "--model", str(args.model),
           "--seed", str(seed), "--prompt-tokens", str(args.prompt_tokens),
           "--decode-prompt-tokens", str(args.decode_prompt_tokens),
           "--new-tokens", str(args.new_tokens)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, float] = json.loads(line.removeprefix("RESULT "))
            return result
    raise RuntimeError(f"{name} worker failed ({done.returncode}): {done.stderr[-400:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_threads", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path,
                   default=Path.home() / ".cache/kvengine/models/smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, of {', '.join(POLICIES)}")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--decode-prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    names = args.policies.split(",")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        p.error(f"unknown policy {unknown[0]!r}: choose from {', '.join(POLICIES)}")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            runs[name].append(run_policy(name, args, seed=r))
        loads.append(os.getloadavg()[0])
        print(f"  round {r + 1} (load {loads[-1]:.1f}): "
              + json.dumps({n: runs[n][-1] for n in names}), file=sys.stderr, flush=True)
    cases = ("prefill", "decode_1", "decode_8")
    med = {n: {c: statistics.median(x[c] for x in runs[n]) for c in cases} for n in names}
    base = med.get("default", med[names[0]])
    print(f"# {args.model.name} bf16, {args.rounds} rounds (median), load average "
          f"{min(loads):.1f}-{max(loads):.1f}; tok/s and / default")
    print("| policy | prefill tok/s | decode 1 tok/s | decode 8 tok/s |\n|---|---|---|---|")
    for n in names:
        cells = " | ".join(f"{med[n][c]:.1f} ({med[n][c] / base[c]:.2f}×)" for c in cases)
        print(f"| {n} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
