"""``kvengine replay-fidelity``: the drift of bounded replay against a cold prefill, published.

For every prompt, hit length and ``keep`` (0 = exact mode), a multi-turn session is run
twice: cold (every turn prefilled from nothing) and cached (turn 1 hits the prompt's
cached prefix, later turns what earlier turns committed: drift compounds). Per turn it
reports the largest and mean absolute logit difference, the KL divergence of the
next-token distributions and the greedy agreement over the generated tokens
(``engine.entrypoints.fidelity``). A table per ``keep`` and turn, or ``--json``:
``{"model", "dtype", "keeps", "safe_keep_tokens", "summary": [...], "runs": [...]}``.

Keeps below the model's safe default are measured too (the replay is forced): the report
exists to show that drift. Given explicitly, they need ``--force``.

``--contexts 2048,8192`` measures instead on real text (a coding agent's session of
standard-library sources) at those contexts, teacher-forced on the cold continuation, next
to the noise floor of cold runs scheduled differently, and applies the pre-registered rule
(``engine.entrypoints.fidelity_report``, ``engine.entrypoints.forced_fidelity``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from bounded_replay import default_keep_tokens
from engine.entrypoints.fidelity import FidelityCase, FidelityRunner, FidelitySettings, summarize
from engine.entrypoints.fidelity_report import (
    append_result,
    check_rule,
    measure,
    read_results,
    report,
    results_header,
    validate,
)
from engine.entrypoints.forced_fidelity import ForcedSettings
from engine.errors import EngineInputError
from engine.model.loader import load_model
from kvstore.textfile import read_text


def _ints(text: str, name: str, *, default: int | None = None,
          double: int | None = None) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part == "default" and default is not None:
            out.append(default)
            continue
        if part == "double" and double is not None:
            out.append(double)
            continue
        try:
            v = int(part)
        except ValueError:
            raise EngineInputError(f"{name}: {part!r} is not a whole number") from None
        if v < 0:
            raise EngineInputError(f"{name}: {v} is negative")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _fractions(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise EngineInputError(f"--hits: {text!r} is not a list of fractions") from None
    if not all(0 < f < 1 for f in out):
        raise EngineInputError("--hits: every fraction must lie in (0, 1)")
    return out


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (Hugging Face layout)")
    p.add_argument("--keep",
                   help="comma-separated keeps to measure; 0 = exact mode, 'default' = the "
                        "model's safe default (largest window + 12), 'double' = 2 x the "
                        "largest window + 12; default: 0,64,default,256, with --contexts "
                        "default,140,double (the default list's unsafe keeps run forced)")
    p.add_argument("--force", action="store_true",
                   help="measure an explicit --keep below the safe default")
    p.add_argument("--contexts", metavar="TOKENS",
                   help="comma-separated prompt lengths: measure on real text (a coding "
                        "agent's session), teacher-forced over --new-tokens positions, "
                        "against the noise floor, and apply the default-mode rule")
    p.add_argument("--prompts", metavar="FILE",
                   help="one prompt per line (text, encoded with the checkpoint's "
                        "tokenizer); default: random token prompts of --lengths")
    p.add_argument("--lengths", default="1024,2048",
                   help="random prompts: lengths in tokens")
    p.add_argument("--num-prompts", type=int, default=2, help="random prompts per length")
    p.add_argument("--hits", default="0.5,0.9",
                   help="cached share of each prompt before turn 1 (whole blocks)")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--turn-tokens", type=int, default=64,
                   help="new user tokens per later turn")
    p.add_argument("--new-tokens", type=int,
                   help="tokens generated greedily per turn (greedy agreement is over them); "
                        "default 16, with --contexts 64")
    p.add_argument("--block-tokens", type=int, default=64, help="pool and store block size")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default: the checkpoint's); float32 shows "
                        "exact mode at float tolerance, without bfloat16's rounding noise")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens")
    p.add_argument("--out", type=Path, metavar="FILE",
                   help="with --contexts: a results file (JSON lines, one run each) that "
                        "each run is appended to as it ends; runs it already holds for the "
                        "same model, dtype and settings are not measured again (resume a "
                        "long job, or add contexts one invocation at a time); the report "
                        "covers the file's rows for --contexts")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cases(args: argparse.Namespace, vocab: int, encode) -> list[FidelityCase]:  # type: ignore[no-untyped-def]
    hits = _fractions(args.hits)
    prompts: list[list[int]] = []
    if args.prompts:
        lines = read_text(args.prompts, "--prompts").splitlines()  # names the file
        prompts = [encode(line) for line in lines if line.strip()]
        if not prompts:
            raise EngineInputError(f"prompts file {args.prompts} has no prompt")
    else:
        if args.num_prompts < 1:
            raise EngineInputError("--num-prompts must be >= 1")
        g = torch.Generator().manual_seed(args.seed + 1)
        for n in _ints(args.lengths, "--lengths"):
            if n < 2:
                raise EngineInputError("--lengths: a prompt needs at least 2 tokens")
            prompts += [torch.randint(0, vocab, (n,), generator=g).tolist()
                        for _ in range(args.num_prompts)]
    return [FidelityCase(i, tuple(p), f) for i, p in enumerate(prompts) for f in hits]


def _run_contexts(args: argparse.Namespace, lm, safe: int) -> int:  # type: ignore[no-untyped-def]
    contexts = _ints(args.contexts, "--contexts")
    keeps = _ints(args.keep or "default,140,double", "--keep", default=safe,
                  double=max(2 * safe - 12, 0))
    validate(lm, contexts, keeps, args.new_tokens, explicit_keeps=args.keep is not None,
             force=args.force, safe=safe)
    settings = ForcedSettings(keeps_tokens=keeps, new_tokens=args.new_tokens,
                              block_tokens=args.block_tokens)
    if args.out is None:
        runs = measure(lm, contexts, settings, progress=not args.json)
    else:  # resumable: what the file holds is not measured again, each new row lands there
        header = results_header(lm, settings)
        done = read_results(args.out, header)
        measure(lm, contexts, settings, progress=not args.json, done=done,
                on_row=lambda r: append_result(args.out, header, r))
        order = {c: i for i, c in enumerate(contexts)}
        runs = sorted((r for r in read_results(args.out, header)
                       if r.context_tokens in order), key=lambda r: order[r.context_tokens])
    print(report(lm, runs, check_rule(runs, safe), settings, safe, args.json))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.new_tokens is None:
        args.new_tokens = 64 if args.contexts is not None else 16
    for name in ("turns", "new_tokens", "block_tokens"):
        if getattr(args, name) < 1:
            raise EngineInputError(f"--{name.replace('_', '-')} must be >= 1")
    if args.turn_tokens < 0:
        raise EngineInputError("--turn-tokens must be >= 0")
    lm = load_model(args.model, dtype=args.dtype, progress=not args.json)
    safe = default_keep_tokens(lm.spec.layer_windows)
    if args.contexts is not None:
        return _run_contexts(args, lm, safe)
    keeps = _ints(args.keep or "0,64,default,256", "--keep", default=safe,
                  double=max(2 * safe - 12, 0))
    if args.keep is not None:
        validate(lm, (64,), keeps, 0, explicit_keeps=True, force=args.force, safe=safe)
    settings = FidelitySettings(keeps_tokens=keeps, turns=args.turns,
                                turn_tokens=args.turn_tokens, new_tokens=args.new_tokens,
                                seed=args.seed, block_tokens=args.block_tokens)
    runner = FidelityRunner(lm, settings)
    cases = _cases(args, lm.spec.vocab_size, lm.tokenizer.encode)
    bar = tqdm(total=len(cases), desc="sessions", unit="case", disable=args.json)
    rows = runner.run(cases, on_case=lambda: bar.update(1))
    bar.close()
    summary = summarize(rows)
    dtype = str(lm.spec.dtype).removeprefix("torch.")
    if args.json:
        print(json.dumps({"model": lm.spec.name, "dtype": dtype,
                          "keeps": list(keeps),
                          "safe_keep_tokens": safe,
                          "summary": [s.as_json() for s in summary],
                          "runs": [asdict(r) for r in rows]}))
        return 0
    print(f"model {lm.spec.name} ({dtype}): {len(cases)} sessions of {args.turns} turns, "
          f"{args.new_tokens} new tokens per turn; safe keep {safe}; against a cold prefill")
    cols = ("keep", "mode", "turn", "runs", "replayed", "max|dlogit|", "mean|dlogit|",
            "KL mean", "KL max", "greedy agree")
    widths = (5, 8, 4, 4, 8, 11, 12, 9, 9, 12)
    print(" ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for s in summary:
        cells = (str(s.keep_tokens), s.mode, str(s.turn), str(s.runs),
                 f"{s.mean_replayed_tokens:.0f}", f"{s.max_abs_logit_diff:.3g}",
                 f"{s.mean_abs_logit_diff:.3g}", f"{s.mean_kl_divergence:.3g}",
                 f"{s.max_kl_divergence:.3g}",
                 f"{s.mean_greedy_agreement:.0%} (min {s.min_greedy_agreement:.0%})")
        print(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return 0
