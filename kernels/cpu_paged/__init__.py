"""``cpu_paged``: the torch reference with decode attention from a compiled C kernel.

Decode (one query per sequence) is where the reference pays for paging on the CPU: it
gathers each round's blocks into scratch and calls ATen's flash kernel, which tiles for long
query blocks while a decode query is a few rows per KV head. ``decode.py`` reads the blocks
in place instead. Prefill and the KV copies are the reference's, and so is decode for what
the kernel does not take (float16 pools, very large query groups).

The backend is handed out only after ``selfcheck.run_selfcheck`` agreed with the reference
on this machine; ``default_backend_name("cpu")`` picks it when that holds.
"""

from __future__ import annotations

import torch

from kernels.cpu_paged import decode
from kernels.cpu_paged.selfcheck import run_selfcheck
from kernels.errors import BackendUnavailable
from kernels.torch_ref import TorchBackend


class CpuPagedBackend(TorchBackend):
    name = "cpu_paged"

    def __init__(self) -> None:
        decode.require_extension()
        result = run_selfcheck()
        if not result.ok:
            raise BackendUnavailable(f"cpu_paged failed its self-check: {result.detail}")

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
        if not decode.supports(q, k_pool):
            return super().paged_decode_attention(q, k_pool, v_pool, block_tables, seq_lens,
                                                  scale, window, kv_start)
        return decode.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, scale, window,
                                   kv_start)


__all__ = ["CpuPagedBackend"]
