"""``kvengine replay-fidelity --contexts``: the teacher-forced table on real text, and the
pre-registered rule (bounded_replay/README.md) applied to it.

Per context: the noise floor (``chunk``: 512 vs 2,048 tokens per step; ``batch``: the same
request batched with two others) and every ``keep``'s cached run, against the cold
reference, over the next ``--new-tokens`` positions
(``engine.entrypoints.forced_fidelity``). The rule's figure is the default keep's mean
KL over the ``chunk`` floor's, at each context.

``--json``: ``{"model", "dtype", "python", "contexts", "keeps", "safe_keep_tokens",
"new_tokens", "reference_chunk_tokens", "noise_chunk_tokens", "runs": [ForcedRun...],
"rule": {"factor", "default_keep_tokens", "checks": [RuleCheck...], "verdict"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from engine.entrypoints.fidelity_prompts import agent_prompt, python_version
from engine.entrypoints.forced_fidelity import (
    BATCH_OTHERS_TOKENS,
    ForcedRun,
    ForcedRunner,
    ForcedSettings,
)
from engine.errors import EngineInputError
from engine.model.loader import LoadedModel
from kvstore.textfile import read_text

#: The rule: bounded replay stays the default only within this many times the floor.
RULE_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class RuleCheck:
    context_tokens: int
    default_kl_mean: float
    chunk_floor_kl_mean: float
    ratio: float  # inf when the floor is 0 and the default is not
    within: bool

    def as_json(self) -> dict[str, object]:
        return {"context_tokens": self.context_tokens, "default_kl_mean": self.default_kl_mean,
                "chunk_floor_kl_mean": self.chunk_floor_kl_mean,
                "ratio": None if self.ratio == float("inf") else self.ratio,
                "within": self.within}


def check_rule(runs: list[ForcedRun], default_keep: int) -> list[RuleCheck]:
    """Per context measured with both the default keep and the chunk floor."""
    out = []
    for ctx in sorted({r.context_tokens for r in runs}):
        at = {r.run: r for r in runs if r.context_tokens == ctx}
        d, f = at.get(f"keep {default_keep}"), at.get("chunk")
        if d is None or f is None:
            continue
        ratio = (d.kl_mean / f.kl_mean if f.kl_mean > 0
                 else (0.0 if d.kl_mean == 0 else float("inf")))
        out.append(RuleCheck(ctx, d.kl_mean, f.kl_mean, ratio,
                             d.kl_mean <= RULE_FACTOR * f.kl_mean))
    return out


def verdict(checks: list[RuleCheck]) -> str:
    if not checks:
        return "no context measured both the default keep and the chunk floor"
    ctxs = ",".join(str(c.context_tokens) for c in checks)
    if all(c.within for c in checks):
        return (f"bounded replay within {RULE_FACTOR:g}x the chunking floor at every "
                f"measured context ({ctxs}): it may stay the default")
    bad = ",".join(str(c.context_tokens) for c in checks if not c.within)
    return (f"bounded replay beyond {RULE_FACTOR:g}x the chunking floor at {bad} "
            f"(measured: {ctxs}): exact mode must be the default")


def validate(lm: LoadedModel, contexts: tuple[int, ...], keeps: tuple[int, ...],
             new_tokens: int, *, explicit_keeps: bool, force: bool, safe: int) -> None:
    """Bad input, before any work: one line each (``EngineInputError``, exit 2)."""
    spec = lm.spec
    if not contexts:
        raise EngineInputError("--contexts: no context given")
    for c in contexts:
        if c < 64:
            raise EngineInputError(f"--contexts: {c} tokens is too short (at least 64)")
        if c + new_tokens > spec.max_context_tokens:
            raise EngineInputError(
                f"--contexts: {c} tokens + {new_tokens} new is longer than {spec.name}'s "
                f"context of {spec.max_context_tokens} tokens")
    windows = [w for w in spec.layer_windows if w is not None]
    if not windows and any(keeps):
        raise EngineInputError(
            f"--keep: {spec.name} has no sliding layers, bounded replay has nothing to "
            "replay (--keep 0 measures exact mode)")
    low = [k for k in keeps if 0 < k < safe]
    if low and explicit_keeps and not force:
        raise EngineInputError(
            f"--keep {low[0]} is below the safe minimum of {safe} tokens (largest window + "
            "12); pass --force to measure it")


def expected_runs(settings: ForcedSettings) -> frozenset[str]:
    return frozenset({"chunk", "batch", *(f"keep {k}" for k in settings.keeps_tokens)})


def measure(lm: LoadedModel, contexts: tuple[int, ...], settings: ForcedSettings,
            progress: bool, done: Sequence[ForcedRun] = (),
            on_row: Callable[[ForcedRun], None] | None = None) -> list[ForcedRun]:
    """The new rows; ``done``: rows measured before (a results file), not run again."""
    encode = lm.tokenizer.encode

    def others(n: int) -> list[list[int]]:
        return [agent_prompt(encode, min(t, max(n // 2, 32)), skip=i + 1)
                for i, t in enumerate(BATCH_OTHERS_TOKENS)]

    runner = ForcedRunner(lm, settings, others)
    want = expected_runs(settings)
    skips = {c: frozenset(r.run for r in done if r.context_tokens == c) & want
             for c in contexts}
    todo = [c for c in contexts if skips[c] != want]
    per_case = 3 + len(settings.keeps_tokens) + max(0, len(settings.keeps_tokens) - 3)
    bar = tqdm(total=per_case * len(todo), desc="runs", unit="run", disable=not progress)
    runs: list[ForcedRun] = []
    for c in todo:
        bar.set_postfix_str(f"context {c}")
        runs += runner.run_case(agent_prompt(encode, c), on_run=lambda _n: bar.update(1),
                                on_row=on_row, skip=skips[c])
    bar.close()
    return runs


def results_header(lm: LoadedModel, settings: ForcedSettings) -> dict[str, object]:
    """What a results file's rows must share to be read back as one measurement."""
    return {"model": lm.spec.name, "dtype": str(lm.spec.dtype).removeprefix("torch."),
            "python": python_version(), "new_tokens": settings.new_tokens,
            "block_tokens": settings.block_tokens,
            "reference_chunk_tokens": settings.reference_chunk_tokens,
            "noise_chunk_tokens": settings.noise_chunk_tokens}


def read_results(path: Path, header: dict[str, object]) -> list[ForcedRun]:
    """The rows of ``path`` (JSON lines) measured under ``header``; others (another dtype,
    model...) are left alone. A missing file has none."""
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(read_text(str(path), "--out").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if {k: doc.get(k) for k in header} == header:
                out.append(ForcedRun(**doc["run"]))
        except (ValueError, TypeError, KeyError):
            raise EngineInputError(f"--out {path}: line {i} is not a result row") from None
    return out


def append_result(path: Path, header: dict[str, object], run: ForcedRun) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({**header, "run": run.as_json()}) + "\n")


def report(lm: LoadedModel, runs: list[ForcedRun], checks: list[RuleCheck],
           settings: ForcedSettings, safe: int, as_json: bool) -> str:
    dtype = str(lm.spec.dtype).removeprefix("torch.")
    if as_json:
        return json.dumps({
            "model": lm.spec.name, "dtype": dtype, "python": python_version(),
            "contexts": sorted({r.context_tokens for r in runs}),
            "keeps": list(settings.keeps_tokens), "safe_keep_tokens": safe,
            "new_tokens": settings.new_tokens,
            "reference_chunk_tokens": settings.reference_chunk_tokens,
            "noise_chunk_tokens": settings.noise_chunk_tokens,
            "runs": [r.as_json() for r in runs],
            "rule": {"factor": RULE_FACTOR, "default_keep_tokens": safe,
                     "checks": [c.as_json() for c in checks], "verdict": verdict(checks)}})
    lines = [f"model {lm.spec.name} ({dtype}), real text (a coding agent's session of "
             f"Python {python_version()} stdlib sources), next {settings.new_tokens} "
             "positions teacher-forced on the cold reference "
             f"({settings.reference_chunk_tokens} tokens per step)"]
    lines += table(runs)
    lines.append(f"rule (bfloat16 figure): default keep {safe} mean KL <= "
                 f"{RULE_FACTOR:g}x the chunk floor at every context")
    for c in checks:
        lines.append(f"  context {c.context_tokens}: {c.default_kl_mean:.3g} vs floor "
                     f"{c.chunk_floor_kl_mean:.3g} = {c.ratio:.3g}x "
                     f"{'within' if c.within else 'BEYOND'}")
    lines.append(verdict(checks) + ("" if dtype == "bfloat16" else
                                    f" (measured in {dtype}: the rule is judged in bfloat16)"))
    return "\n".join(lines)


def table(runs: list[ForcedRun]) -> list[str]:
    cols = ("context", "run", "mode", "fill", "hit", "replayed", "KL mean", "KL p99",
            "top-1", "greedy len")
    widths = (7, 9, 7, 9, 6, 8, 9, 9, 6, 10)
    out = [" ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    for r in runs:
        cells = (str(r.context_tokens), r.run, r.mode, r.fill or "-", str(r.hit_tokens),
                 str(r.replayed_tokens), f"{r.kl_mean:.3g}", f"{r.kl_p99:.3g}",
                 f"{r.top1_agreement:.0%}", f"{r.greedy_agreement_tokens}/{r.positions}")
        out.append(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return out
