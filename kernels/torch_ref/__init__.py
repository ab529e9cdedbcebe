"""The reference backend: vectorised torch that runs on any device.

It defines the numbers the other backends are tested against, and it is what the engine
uses on a CPU. See ``attention.py`` for how a sequence's keys are split into chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.backend import AttentionBackend
from kernels.torch_ref import attention, copies


class TorchBackend(AttentionBackend):
    name = "torch"

    def write_kv_slots(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        copies.write_kv_slots(k, v, k_pool, v_pool, slot_mapping)

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
        return attention.paged_prefill(
            q, k_pool, v_pool, cu_seqlens_q, block_tables, seq_lens, scale, window, kv_start
        )

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
        return attention.paged_decode(
            q, k_pool, v_pool, block_tables, seq_lens, scale, window, kv_start
        )

    def read_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        out: torch.Tensor,
    ) -> None:
        copies.read_kv_blocks(k_pools, v_pools, block_ids, layers, out)

    def write_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        src: torch.Tensor,
    ) -> None:
        copies.write_kv_blocks(k_pools, v_pools, block_ids, layers, src)


__all__ = ["TorchBackend"]
