"""The grammars' masks on the batch's logits: llguidance fills every constrained row's
bitmask in one call (in parallel, in Rust) and one tensor operation applies them all; the
sampled tokens go back to the matchers in one call too. No per-row Python per token but
building the list of matchers."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import llguidance
import llguidance.torch as llt
import torch

from engine.sequence import Sequence

_EXECUTOR = llguidance.LLExecutor()  # its thread pool fills the rows' masks in parallel


def apply_constraints(logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
    """Tokens a row's grammar forbids get ``-inf`` (in place); rows without one keep all."""
    rows = [(s.constraint, i) for i, s in enumerate(seqs) if s.constraint is not None]
    bitmask = llt.allocate_token_bitmask(len(seqs), logits.shape[1])  # all allowed (-1)
    llt.fill_next_token_bitmask_par(_EXECUTOR, rows, bitmask)
    if logits.device.type == "cpu":
        llt.apply_token_bitmask_inplace(logits, bitmask)
        return
    llt.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True))


def advance(seqs: Seq[Sequence], tokens: Seq[int]) -> None:
    """The sampled tokens into their rows' matchers."""
    pairs = [(s.constraint, t) for s, t in zip(seqs, tokens, strict=True)
             if s.constraint is not None]
    if pairs:
        llt.consume_token_par(_EXECUTOR, pairs)
