"""The batch-invariant backend (``invariant``): attention in a fixed order per query row.

``kvengine --deterministic`` picks it (``engine.core.numerics``). It computes what the
reference backend computes (same contract, float32 accumulation) but in an order fixed by
each query's position alone (``attention.py``), so a token's output is bitwise the same
whatever shares its step, however its prefill was chunked and wherever its prefix's KV came
from. KV copies are exact, so they are the reference's. ``matmul.py`` holds the padded
products it (and the engine's deterministic linear layers) rely on.
"""

from __future__ import annotations

import torch

from kernels.invariant import attention
from kernels.torch_ref import TorchBackend


class InvariantBackend(TorchBackend):
    """The reference's copies; attention from ``attention.py``."""

    name = "invariant"

    def paged_prefill_attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        kv_start: torch.Tensor | None,
    ) -> torch.Tensor:
        return attention.paged_prefill(q, k_pool, v_pool, cu_seqlens_q, block_tables,
                                       seq_lens, scale, window, kv_start)

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        kv_start: torch.Tensor | None,
    ) -> torch.Tensor:
        return attention.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, scale,
                                      window, kv_start)


__all__ = ["InvariantBackend"]
