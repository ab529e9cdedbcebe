"""The batched sampler: each parameter's effect on the drawn token, seeds that hold whatever
the batch, and the recorded log probabilities."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.sampler import sample
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.errors import EngineInputError

VOCAB = 16


def seq(prompt: list[int] | None = None, output: list[int] = (), **params: object
        ) -> Sequence:  # type: ignore[assignment]
    s = Sequence(prompt or [1, 2], SamplingParams(**params))  # type: ignore[arg-type]
    s.token_ids.extend(output)
    return s


def logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def ramp() -> list[float]:
    return [float(i) / 4 for i in range(VOCAB)]  # token 15 most likely


def test_greedy_is_argmax_and_truncation_to_one_is_greedy() -> None:
    rows = [seq(), seq(temperature=1.0, top_k=1, seed=1), seq(temperature=1.5, min_p=1.0),
            seq(temperature=1.0, top_p=1e-6, seed=2)]
    assert sample(logits(*[ramp()] * 4), rows) == [15] * 4


def test_a_seed_gives_the_same_draws_alone_and_in_any_batch() -> None:
    def run(batch_size: int, position: int) -> list[int]:
        rows = [seq(temperature=1.0, seed=100 + i) for i in range(batch_size)]
        mine = rows[position] = seq(temperature=1.0, seed=7, top_p=0.9)
        out = []
        for _ in range(20):
            out.append(sample(logits(*[ramp()] * batch_size), rows)[position])
        assert mine.generator is not None
        return out

    alone = run(1, 0)
    assert alone == run(5, 3) == run(3, 0)
    assert len(set(alone)) > 1  # it does sample


def test_draws_follow_the_distribution() -> None:
    s = seq(temperature=1.0, seed=3)
    row = [0.0] * VOCAB
    row[4], row[9] = math.log(3.0), math.log(1.0)  # 3:1 between 4 and 9, tiny rest
    row = [x if i in (4, 9) else -30.0 for i, x in enumerate(row)]
    draws = [sample(logits(row), [s])[0] for _ in range(2000)]
    assert set(draws) == {4, 9}
    assert 0.70 < draws.count(4) / len(draws) < 0.80


def test_top_k_and_top_p_keep_only_the_head() -> None:
    s = seq(temperature=2.0, top_k=3, seed=5)
    t = seq(temperature=1.0, top_p=0.6, seed=6)
    sharp = [-30.0] * VOCAB
    for tok, p in ((15, 0.4), (14, 0.3), (13, 0.2), (12, 0.1)):
        sharp[tok] = math.log(p)
    by_k, by_p = set(), set()
    for _ in range(300):
        a, b = sample(logits(ramp(), sharp), [s, t])
        by_k.add(a)
        by_p.add(b)
    assert by_k == {13, 14, 15} and by_p == {14, 15}


def test_min_p_drops_the_unlikely() -> None:
    row = [-30.0] * VOCAB
    row[2], row[3], row[5] = 0.0, math.log(0.5), math.log(0.05)
    s = seq(temperature=1.0, min_p=0.2, seed=8)
    assert {sample(logits(row), [s])[0] for _ in range(300)} == {2, 3}


def test_logit_bias_forces_and_forbids() -> None:
    up = seq(logit_bias=((3, 100.0),))
    down = seq(logit_bias=((15, -100.0),))
    assert sample(logits(ramp(), ramp()), [up, down]) == [3, 14]


def test_penalties_push_away_from_what_was_said() -> None:
    row = ramp()
    rows = [seq(output=[15], presence_penalty=2.0),
            seq(output=[15, 15, 15, 15], frequency_penalty=0.2),
            seq(output=[15], frequency_penalty=0.2),
            seq(prompt=[15], repetition_penalty=2.0),
            seq(output=[15])]  # no penalty
    assert sample(logits(*[row] * 5), rows) == [14, 14, 15, 14, 15]
    neg = [-float(i) for i in range(VOCAB)]  # token 0 best at 0; token 1 at -1
    assert sample(logits(neg), [seq(prompt=[0], repetition_penalty=2.0)]) == [0]
    neg[0] = -0.6  # -0.6 * 2 = -1.2 < -1: the repeated token loses
    assert sample(logits(neg), [seq(prompt=[0], repetition_penalty=2.0)]) == [1]


def test_logprobs_are_the_models_and_top_is_best_first() -> None:
    s, plain = seq(logprobs=3, temperature=1.0, seed=1, logit_bias=((0, 50.0),)), seq()
    row = ramp()
    tok = sample(logits(row, row), [s, plain])
    assert tok[0] == 0 and plain.logprobs == []
    (lp,) = s.logprobs
    ref = torch.log_softmax(torch.tensor(row), -1)
    assert lp.token_id == 0 and lp.logprob == pytest.approx(float(ref[0]))
    assert [t for t, _ in lp.top] == [15, 14, 13]
    assert lp.top[0][1] == pytest.approx(float(ref[15]))


@pytest.mark.parametrize("bad", [
    {"top_k": -2}, {"min_p": 1.5}, {"presence_penalty": 3}, {"frequency_penalty": -2.5},
    {"repetition_penalty": 0}, {"logit_bias": ((1, 101.0),)}, {"logprobs": 21},
    {"stop_token_ids": (-1,)},
])
def test_out_of_range_parameters_are_refused(bad: dict) -> None:
    with pytest.raises(EngineInputError):
        SamplingParams(**bad)


def _truncate_by_full_sort(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The definition: rank the whole vocabulary, keep rank < top_k and mass above < top_p."""
    out = torch.zeros_like(probs)
    for i, p in enumerate(params):
        sorted_p, order = probs[i].sort(descending=True)
        k = p.top_k if p.top_k > 0 else probs.shape[1]
        before = sorted_p.cumsum(0) - sorted_p
        keep = (torch.arange(probs.shape[1]) < k) & (before < p.top_p)
        out[i, order[keep]] = sorted_p[keep]
    return out


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([1.0, 0.9, 0.5, 0.05])),
                     min_size=1, max_size=5),
       seed=st.integers(0, 2**16))
def test_truncation_equals_a_full_sort(rows: list[tuple[int, float]], seed: int) -> None:
    from engine.core.sampler import truncate

    vocab = 32
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(len(rows), vocab, generator=g) * 3, dim=-1)
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=p) for k, p in rows]
    torch.testing.assert_close(truncate(probs, params), _truncate_by_full_sort(probs, params),
                               rtol=1e-6, atol=1e-7)
