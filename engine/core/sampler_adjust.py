"""The logits a request samples from: penalties, ``logit_bias`` and the grammar's mask,
applied to the batch's rows with tensor operations (the rows that ask for none are left as
they are; nothing is copied when no row asks)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from engine.core.sequence import Sequence


def adjust_logits(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    """``logits`` (float32 ``[len(seqs), vocab]``) as the requests' parameters change them;
    the input is never modified (its raw values give the logprobs)."""
    out = logits
    pen = [i for i, s in enumerate(seqs) if s.params.has_penalties]
    if pen:
        out = out.clone()
        _penalize(out, [seqs[i] for i in pen], pen)
    if any(s.params.logit_bias for s in seqs):
        out = out.clone() if out is logits else out
        _bias(out, seqs)
    if any(s.constraint is not None for s in seqs):
        from engine.structured.mask import apply_constraints

        out = out.clone() if out is logits else out
        apply_constraints(out, seqs)
    return out


def _penalize(logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
    """vLLM's definitions: presence and frequency count the output tokens; repetition
    covers the prompt's tokens and the output's."""
    vocab = logits.shape[1]
    dev = logits.device
    idx = torch.tensor(rows, device=dev)
    sub = logits[idx]
    counts = torch.zeros_like(sub)
    outs = [s.output_ids for s in seqs]
    r = torch.tensor([j for j, o in enumerate(outs) for _ in o], dtype=torch.long, device=dev)
    t = torch.tensor([x for o in outs for x in o], dtype=torch.long, device=dev)
    counts.index_put_((r, t), torch.ones_like(t, dtype=sub.dtype), accumulate=True)
    params = [s.params for s in seqs]
    if any(p.repetition_penalty != 1 for p in params):
        seen = counts > 0
        prompts = [[x for x in s.token_ids[: s.num_prompt_tokens] if x < vocab] for s in seqs]
        pr = torch.tensor([j for j, o in enumerate(prompts) for _ in o], dtype=torch.long,
                          device=dev)
        pt = torch.tensor([x for o in prompts for x in o], dtype=torch.long, device=dev)
        seen[pr, pt] = True
        rep = torch.tensor([p.repetition_penalty for p in params], device=dev).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], device=dev).unsqueeze(1)
    sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits[idx] = sub


def _bias(logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
    vocab = logits.shape[1]
    entries = [(row, tok, bias) for row, s in enumerate(seqs)
               for tok, bias in s.params.logit_bias if tok < vocab]
    if not entries:
        return
    dev = logits.device
    rows, toks, biases = zip(*entries, strict=True)
    logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                      torch.tensor(biases, dtype=logits.dtype, device=dev), accumulate=True)
