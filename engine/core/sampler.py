"""Next tokens from the step's logits, for the whole batch at once.

Every step is a tensor operation over the batch's rows: the logits adjusted (penalties,
``logit_bias``, the grammar's mask: ``engine.core.sampler_adjust``), argmax for every row, and
for the sampled rows temperature, ``min_p``, ``top_k``/``top_p`` (a partial ``topk`` when
every row has a ``top_k``, one batched sort otherwise) and one inverse-CDF draw.
The only per-row Python is one uniform draw from each sampled request's own generator, so a
request's draws never depend on its batch (the same seed gives the same output alone or
among others) — a batched generator would tie them together."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from engine.core.sampler_adjust import adjust_logits
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence, TokenLogprob


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """``logits`` is ``[len(seqs), vocab]``; returns one token id per row. Rows that asked
    for logprobs get a ``TokenLogprob`` appended to ``seq.logprobs``."""
    raw = logits.float()
    adjusted = adjust_logits(raw, seqs)
    tokens = adjusted.argmax(dim=-1)
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if rows:
        idx = torch.tensor(rows, device=raw.device)
        tokens[idx] = _draw(adjusted[idx], [seqs[i] for i in rows])
    want = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    if want:
        _record_logprobs(raw, tokens, [seqs[i] for i in want], want)
    out = [int(t) for t in tokens.tolist()]
    if any(s.constraint is not None for s in seqs):
        from engine.structured.mask import advance

        advance(seqs, out)
    return out


def _column(params: Seq[SamplingParams], name: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([float(getattr(p, name)) for p in params], dtype=torch.float32,
                        device=like.device).unsqueeze(1)


def _draw(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    """One token per row of ``logits`` (its rows' requests all sample)."""
    params = [s.params for s in seqs]
    vocab = logits.shape[1]
    probs = torch.softmax(logits / _column(params, "temperature", logits), dim=-1)
    if any(p.min_p > 0 for p in params):
        floor = _column(params, "min_p", probs) * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    if any(p.truncates for p in params):
        probs = truncate(probs, params)
    # Inverse CDF: the first token whose cumulative mass exceeds u × the row's total (the
    # rows are not renormalised; float64 so that a tail of tiny masses stays ordered).
    cdf = probs.double().cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=s.generator, dtype=torch.float64)
                   for s in seqs]).to(cdf.device)
    target = (u * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=vocab - 1)


def truncate(probs: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
    """``probs`` with each row's mass outside its ``top_k`` and ``top_p`` set to 0."""
    vocab = probs.shape[1]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    # Every row capped by a top-k: rank only its largest k (a partial top-k, not a sort of
    # the whole vocabulary); top-p then cuts inside them.
    width = max(ks)
    if width < vocab:
        sorted_p, order = probs.topk(width, dim=-1)
    else:
        sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(width, device=probs.device).unsqueeze(0)
    k = torch.tensor(ks, device=probs.device).unsqueeze(1)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass ranked above each token
    drop = (ranks >= k) | (before >= _column(params, "top_p", probs))
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(drop, 0.0))


def _record_logprobs(raw: torch.Tensor, tokens: torch.Tensor, seqs: Seq[Sequence],
                     rows: list[int]) -> None:
    idx = torch.tensor(rows, device=raw.device)
    lp = torch.log_softmax(raw[idx], dim=-1)
    chosen = lp.gather(1, tokens[idx].unsqueeze(1)).squeeze(1).tolist()
    k = max(s.params.logprobs or 0 for s in seqs)
    top_v, top_i = (lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long()))
    top_v_l, top_i_l = top_v.tolist(), top_i.tolist()
    for j, seq in enumerate(seqs):
        n = seq.params.logprobs or 0
        seq.logprobs.append(TokenLogprob(
            int(tokens[rows[j]]), float(chosen[j]),
            tuple(zip(top_i_l[j][:n], top_v_l[j][:n], strict=True))))
