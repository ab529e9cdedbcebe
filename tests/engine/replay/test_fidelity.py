"""``engine.entrypoints.fidelity``: the comparison against a cold run, and multi-turn
sessions on the 4-layer hybrid checkpoint, where a replay really drifts."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.entrypoints.fidelity import (
    FidelityCase,
    FidelityRunner,
    FidelitySettings,
    Generated,
    compare,
    summarize,
)
from engine.model.loader import LoadedModel
from tests.engine.replay.harness import tokens

KEEP = 24 + 12


def gen(ids: list[int], logits: torch.Tensor) -> Generated:
    return Generated(ids, logits, 0, 0)


def test_identical_runs_compare_as_zero() -> None:
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    steps, mx, mean, kl, agree = compare(gen([1, 2, 3, 4, 5], logits),
                                         gen([1, 2, 3, 4, 5], logits.clone()))
    assert (steps, mx, mean, agree) == (5, 0.0, 0.0, 1.0) and kl == pytest.approx(0, abs=1e-12)


def test_comparison_stops_after_the_first_different_token() -> None:
    a = torch.zeros(4, 3)
    b = torch.zeros(4, 3)
    b[1, 0] = 0.5  # the step that chose differently still had the same input: compared
    b[3, 2] = 100.0  # after it the inputs differ: not compared
    steps, mx, mean, kl, agree = compare(gen([0, 0, 0, 0], a), gen([0, 2, 1, 1], b))
    assert steps == 2 and agree == 0.25 and mx == 0.5
    assert mean == pytest.approx(0.5 / 6)
    p = torch.softmax(torch.zeros(3, dtype=torch.float64), 0)
    q = torch.softmax(torch.tensor([0.5, 0, 0], dtype=torch.float64), 0)
    assert kl == pytest.approx(float((p * (p / q).log()).sum()) / 2)


def test_multi_turn_sessions_replay_every_turn_and_exact_mode_stays_cold(
    deep: LoadedModel,
) -> None:
    settings = FidelitySettings(keeps_tokens=(0, KEEP), turns=3, turn_tokens=40, new_tokens=6,
                                seed=3, block_tokens=16, max_batched_tokens=128)
    rows = FidelityRunner(deep, settings).run([FidelityCase(0, tuple(tokens(260, 9)), 0.8)])
    assert [(r.keep_tokens, r.turn) for r in rows] == [(0, 1), (0, 2), (0, 3),
                                                       (KEEP, 1), (KEEP, 2), (KEEP, 3)]
    for r in rows:
        if r.keep_tokens == 0:
            assert r.replayed_tokens == 0 and r.max_abs_logit_diff < 1e-4
        else:
            assert r.mode == "bounded" and r.replayed_tokens == KEEP
            assert r.max_abs_logit_diff > 1e-5 and r.kl_divergence > 0
    bounded = [r for r in rows if r.keep_tokens == KEEP]
    assert bounded[0].hit_tokens == 208  # 0.8 of 260, whole blocks of 16
    # Later turns hit every full block earlier turns computed (the replay's too) and
    # committed: prompt and answer, less the last sampled token (never computed).
    for prev, r in itertools.pairwise(bounded):
        assert r.hit_tokens == (prev.prompt_tokens + 6 - 1) // 16 * 16
    summary = summarize(rows)
    assert [(s.keep_tokens, s.turn, s.runs) for s in summary] == [
        (0, 1, 1), (0, 2, 1), (0, 3, 1), (KEEP, 1, 1), (KEEP, 2, 1), (KEEP, 3, 1)]
