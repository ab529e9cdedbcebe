"""``engine.entrypoints.forced_fidelity``: the teacher-forced comparison, the forcing
itself, the noise floor and the cached runs on the 4-layer hybrid checkpoint (a replay
really drifts there); ``engine.entrypoints.fidelity_prompts``: the real-text prompts;
``engine.entrypoints.fidelity_report``: the rule.
One test on the real Gemma 3 270M (a small context): exact mode is exact in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.entrypoints.fidelity_prompts import FINAL, agent_prompt, session_text
from engine.entrypoints.fidelity_report import check_rule, verdict
from engine.entrypoints.forced_fidelity import (
    ForcedRun,
    ForcedRunner,
    ForcedSettings,
    Trace,
    _engine,
    compare,
    run_forced,
)
from engine.model.loader import LoadedModel, load_model
from tests.engine.model.real_models import real_model
from tests.engine.replay.harness import tokens

KEEP = 24 + 12  # the deep checkpoint's safe default


def trace(logits: torch.Tensor) -> Trace:
    return Trace(logits, 0, 0)


def test_identical_traces_compare_as_zero() -> None:
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    kl, p99, top1, greedy = compare(trace(logits), trace(logits.clone()))
    assert kl == pytest.approx(0, abs=1e-12) and p99 == pytest.approx(0, abs=1e-12)
    assert (top1, greedy) == (1.0, 6)


def test_greedy_length_ends_at_the_first_argmax_difference() -> None:
    a = torch.zeros(4, 3)
    a[:, 0] = 5.0
    b = a.clone()
    b[1, 2] = 9.0  # position 1 picks another token, the rest agree
    kl, p99, top1, greedy = compare(trace(a), trace(b))
    assert greedy == 1 and top1 == 0.75
    assert kl > 0 and p99 >= kl  # one position carries all of it: p99 above the mean


def test_forced_tokens_are_the_inputs(deep: LoadedModel) -> None:
    prompt = tokens(100, seed=3)
    cfg = EngineConfig(pool_tokens=4096, block_tokens=16, cache_all_layers=True)
    with _engine(deep, cfg, None) as eng:
        free = run_forced(eng, prompt, 5)
    forced = [(t + 1) % deep.spec.vocab_size for t in free.tokens]
    with _engine(deep, cfg, None) as eng:
        got = run_forced(eng, prompt, 5, forced=forced)
    assert torch.equal(got.logits[0], free.logits[0])  # the same prompt
    assert not torch.allclose(got.logits[1], free.logits[1])  # fed forced[0], not free's
    with _engine(deep, cfg, None) as eng:
        again = run_forced(eng, prompt, 5, forced=free.tokens)
    assert torch.equal(again.logits, free.logits)  # forcing its own tokens changes nothing


def test_noise_floor_and_cached_runs_on_the_deep_hybrid(deep: LoadedModel) -> None:
    settings = ForcedSettings(keeps_tokens=(KEEP, 0, 8, 60), new_tokens=6, block_tokens=16,
                              reference_chunk_tokens=64, noise_chunk_tokens=16)
    runner = ForcedRunner(deep, settings, lambda n: [tokens(40, seed=7), tokens(70, seed=8)])
    done: list[str] = []
    rows = {r.run: r for r in runner.run_case(tokens(150, seed=5), on_run=done.append)}
    # each cached run right after the cold run that filled its store
    assert done == ["reference", f"keep {KEEP}", "chunk", "keep 0", "batch", "keep 8",
                    "fill 60", "keep 60"]
    assert set(rows) == {"chunk", "batch", f"keep {KEEP}", "keep 0", "keep 8", "keep 60"}
    hit = 149 // 16 * 16
    for r in rows.values():
        assert r.positions == 6 and r.context_tokens == 150
    for name in ("chunk", "batch"):
        assert rows[name].mode == "cold" and rows[name].hit_tokens == 0
    assert rows[f"keep {KEEP}"].fill == "reference"
    assert (rows["keep 0"].fill, rows["keep 8"].fill, rows["keep 60"].fill) == (
        "chunk", "batch", "fill 60")
    exact = rows["keep 0"]
    assert exact.mode == "exact" and exact.hit_tokens == hit and exact.replayed_tokens == 0
    for keep in (KEEP, 8, 60):
        r = rows[f"keep {keep}"]
        assert r.mode == "bounded" and r.hit_tokens == hit and r.replayed_tokens == keep
    # The deep checkpoint drifts under a replay far below its window.
    assert rows["keep 8"].kl_mean > rows["keep 0"].kl_mean


def test_skipped_runs_are_not_measured_but_still_fill(deep: LoadedModel) -> None:
    settings = ForcedSettings(keeps_tokens=(KEEP, 8), new_tokens=3, block_tokens=16,
                              reference_chunk_tokens=64, noise_chunk_tokens=16)
    runner = ForcedRunner(deep, settings, lambda n: [tokens(40, seed=7)])
    done: list[str] = []
    made: list[ForcedRun] = []
    rows = runner.run_case(tokens(100, seed=5), on_run=done.append, on_row=made.append,
                           skip=frozenset({"chunk"}))
    # chunk runs only to fill keep 8's store, unrecorded
    assert done == ["reference", f"keep {KEEP}", "chunk", "keep 8", "batch"]
    assert [r.run for r in rows] == [f"keep {KEEP}", "keep 8", "batch"] and made == rows
    assert rows[1].fill == "chunk" and rows[1].replayed_tokens == 8


def run_row(ctx: int, run: str, kl: float) -> ForcedRun:
    return ForcedRun(ctx, run, "x", None, None, 0, 0, 64, kl, kl, 1.0, 64)


def test_the_rule_compares_the_default_keep_with_the_chunk_floor() -> None:
    runs = [run_row(2048, "chunk", 0.01), run_row(2048, "keep 524", 0.019),
            run_row(8192, "chunk", 0.01), run_row(8192, "keep 524", 0.03),
            run_row(16384, "chunk", 0.01)]  # no default keep there: not judged
    checks = check_rule(runs, 524)
    assert [(c.context_tokens, c.within) for c in checks] == [(2048, True), (8192, False)]
    assert checks[1].ratio == pytest.approx(3.0)
    assert "beyond" in verdict(checks) and "8192" in verdict(checks)
    assert "may stay the default" in verdict(checks[:1])


def test_agent_prompts_are_exactly_long_and_extend_one_session(tiny_hybrid_dir: Path) -> None:
    tok = load_model(tiny_hybrid_dir).tokenizer
    short, long = agent_prompt(tok.encode, 300), agent_prompt(tok.encode, 900)
    tail = tok.encode(FINAL, add_special_tokens=False)
    assert len(short) == 300 and len(long) == 900
    assert short[-len(tail):] == tail and long[-len(tail):] == tail
    n = 300 - len(tail) - 8  # the shorter one's turns start the longer one's
    assert short[:n] == long[:n]
    text = session_text(2000)
    assert "Tool output (textwrap.py)" in text and "def " in text
    assert session_text(2000, skip=1) != text


@pytest.mark.slow
def test_exact_mode_on_real_gemma_is_exact_in_float32() -> None:
    """gemma-3-270m, 600 tokens of real text, 8 positions: the figures are computed and
    exact mode reproduces the cold reference (KL ~ 0); the default keep replays 524."""
    lm = load_model(real_model("gemma3-270m"), dtype="float32", progress=False)
    settings = ForcedSettings(keeps_tokens=(0, 524), new_tokens=8)
    runner = ForcedRunner(lm, settings, lambda n: [agent_prompt(lm.tokenizer.encode, 100,
                                                                skip=1)])
    rows = {r.run: r for r in runner.run_case(agent_prompt(lm.tokenizer.encode, 600))}
    exact, bounded = rows["keep 0"], rows["keep 524"]
    assert exact.hit_tokens == 576 and exact.replayed_tokens == 0
    assert exact.kl_mean < 1e-6 and exact.top1_agreement == 1.0
    assert exact.greedy_agreement_tokens == 8
    assert bounded.replayed_tokens == 524 and bounded.kl_mean >= 0
    for r in rows.values():
        assert r.positions == 8 and r.kl_p99 >= 0 and 0 <= r.top1_agreement <= 1
