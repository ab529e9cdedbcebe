"""The grammars' masks on the batch's logits: llguidance fills every constrained row's
bitmask in one call (in parallel, in Rust) and one tensor operation applies them all; the
sampled tokens go back to the matchers in one call too. No per-row Python per token but
building the list of matchers."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import llguidance
import llguidance.torch as llt
import torch

from engine.core.sequence import Sequence

_EXECUTOR = llguidance.LLExecutor()  # its thread pool fills the rows' masks in parallel


def apply_constraints(logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
    """Tokens a row's grammar forbids get ``-inf`` (in place); rows without one keep all."""
    rows = [i for i, s in enumerate(seqs) if s.constraint is not None]
    vocab = logits.shape[1]
    words = (vocab + 31) // 32
    bitmask = torch.empty(len(rows), words, dtype=torch.int32)
    llt.fill_next_token_bitmask_par(
        _EXECUTOR, [(seqs[i].constraint, j) for j, i in enumerate(rows)], bitmask)
    # Unpacked in eager torch, not llguidance's torch.compile'd kernel: compiling on a
    # server's first constrained request costs seconds (and a C++ compiler on CPUs).
    bitmask = bitmask.to(logits.device, non_blocking=True)
    bits = (bitmask.unsqueeze(-1) >> _shifts(logits.device)) & 1
    forbidden = bits.view(len(rows), words * 32)[:, :vocab] == 0
    if len(rows) == len(seqs):  # every row constrained: no gather and scatter
        logits.masked_fill_(forbidden, float("-inf"))
        return
    idx = torch.tensor(rows, device=logits.device)
    logits[idx] = logits[idx].masked_fill(forbidden, float("-inf"))


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    if device not in _SHIFTS:
        _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return _SHIFTS[device]


def advance(seqs: Seq[Sequence], tokens: Seq[int]) -> None:
    """The sampled tokens into their rows' matchers."""
    pairs = [(s.constraint, t) for s, t in zip(seqs, tokens, strict=True)
             if s.constraint is not None]
    if pairs:
        llt.consume_token_par(_EXECUTOR, pairs)
