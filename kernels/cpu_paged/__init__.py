"""``cpu_paged``: the torch reference with prefill and decode attention from compiled C kernels.

Decode (one query per sequence) is where the reference pays for paging on the CPU: it
gathers each round's blocks into scratch and calls ATen's flash kernel, which tiles for long
query blocks while a decode query is a few rows per KV head. ``decode.py`` reads the blocks
in place instead (bf16 with ``vdpbf16ps``, 16 keys at a time, where the CPU has AVX-512
BF16). Prefill is where a cold prompt spends its time, and on a CPU without AMX ATen's flash
kernel runs it at about a third of the bf16 GEMM rate; ``prefill.py`` reads the pool in
place with ``vdpbf16ps`` dot products instead. The KV copies are the reference's,
and so are prefill and decode for what the kernels do not take (float16 pools, say).

The backend is handed out only after ``selfcheck.run_selfcheck`` (decode) agreed with the
reference on this machine; ``default_backend_name("cpu")`` picks it when that holds. The
prefill kernel is used when it is built and ``run_prefill_selfcheck`` agrees too; otherwise
the backend keeps the reference's prefill and says why once (a warning of this module).
"""

from __future__ import annotations

import logging

import torch

from kernels.cpu_paged import decode, prefill
from kernels.cpu_paged.selfcheck import run_prefill_selfcheck, run_selfcheck
from kernels.errors import BackendUnavailable
from kernels.torch_ref import TorchBackend


class CpuPagedBackend(TorchBackend):
    name = "cpu_paged"
    #: The decode kernel's item path: the best this CPU runs (``decode.PATH_BEST``).
    decode_path: int = decode.PATH_BEST

    def __init__(self) -> None:
        decode.require_extension()
        result = run_selfcheck()
        if not result.ok:
            raise BackendUnavailable(f"cpu_paged failed its self-check: {result.detail}")
        #: Why prefill is the reference's here ("" when the C kernel serves it).
        self.prefill_refusal = _prefill_refusal()
        if self.prefill_refusal:
            _log.warning("cpu_paged prefill falls back to the torch reference: %s",
                         self.prefill_refusal)

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
        if self.prefill_refusal or not prefill.supports(q, k_pool):
            return super().paged_prefill_attention(q, k_pool, v_pool, cu_seqlens_q,
                                                   block_tables, seq_lens, scale, window,
                                                   kv_start)
        return prefill.paged_prefill(q, k_pool, v_pool, cu_seqlens_q, block_tables, seq_lens,
                                     scale, window, kv_start)

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
                                   kv_start, path=self.decode_path)


class CpuPagedPortableBackend(CpuPagedBackend):
    """``cpu_paged`` with decode forced onto the kernel's portable path (float32 dot products,
    whatever the CPU): the peer of an A/B against the AVX-512 BF16 path. Not in the
    registry; ``bench/bench_decode_backends.py --backends cpu_paged_portable,cpu_paged``
    registers it."""

    name = "cpu_paged_portable"
    decode_path = decode.PATH_PORTABLE


_log = logging.getLogger(__name__)


def _prefill_refusal() -> str:
    """"" when the prefill kernel is built and agrees with the reference here, else why not."""
    try:
        prefill.require_extension()
    except BackendUnavailable as exc:
        return str(exc)
    result = run_prefill_selfcheck()
    return "" if result.ok else f"failed its self-check: {result.detail}"


__all__ = ["CpuPagedBackend", "CpuPagedPortableBackend"]
