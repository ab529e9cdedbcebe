"""A matrix product whose every row is computed the same way whatever shares its call.

A CPU BLAS picks its code path by the shape of the call: on the machines this was measured
on (MKL sgemm, oneDNN bf16, two threads), a float32 call of 1, 2 or 3 rows takes another
path than one of four or more, and the rows of a ragged tail (``M mod 4``) can take yet
another; so a token's projection depended on how many tokens shared its step. Padding the
rows with zeros to a multiple of ``ROW_TILE`` (16) made every measured row's result depend
on its own data only (``tests/kernels/test_invariant.py`` measures it, and
``engine.core.numerics`` checks the model's own shapes at start-up rather than trust it).
The padded rows cost compute, not weight traffic: a decode step reads each weight once
either way.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

#: Rows of every product are padded to a multiple of this.
ROW_TILE = 16


def padded_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` (rows first) in a fresh contiguous buffer whose rows are a multiple of
    ``ROW_TILE`` (zeros below the real ones), and the real row count."""
    m = x.shape[0]
    rows = max(ROW_TILE, -(-m // ROW_TILE) * ROW_TILE)
    out = x.new_zeros((rows, *x.shape[1:]))
    out[:m] = x
    return out, m


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` over the last dim of ``x``, each row computed as if alone."""
    lead = x.shape[:-1]
    flat, m = padded_rows(x.reshape(-1, x.shape[-1]))
    return F.linear(flat, weight, bias)[:m].reshape(*lead, weight.shape[0])


def invariant_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm`` whose rows of ``a`` (dim 1) are a multiple of ``ROW_TILE`` already:
    the caller pads them (attention pads its query rows once per call)."""
    if a.shape[1] % ROW_TILE:
        raise ValueError(f"invariant_bmm needs rows padded to {ROW_TILE}, got {a.shape[1]}")
    return torch.bmm(a, b)
