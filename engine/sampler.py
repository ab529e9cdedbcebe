"""Next tokens from the step's logits: argmax for greedy requests, nucleus sampling with the
request's own generator otherwise (so one request's draws never depend on its batch)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from engine.sequence import Sequence


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """``logits`` is float32 ``[len(seqs), vocab]``; returns one token id per row."""
    out = logits.argmax(dim=-1).tolist()
    for row, seq in enumerate(seqs):
        params = seq.params
        if params.greedy:
            continue
        probs = torch.softmax(logits[row].float().cpu() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            probs = _top_p(probs, params.top_p)
        out[row] = int(torch.multinomial(probs, 1, generator=seq.generator).item())
    return [int(t) for t in out]


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``."""
    sorted_p, order = probs.sort(descending=True)
    before = sorted_p.cumsum(0) - sorted_p  # mass of the tokens ranked above each one
    sorted_p[before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return kept / kept.sum()
