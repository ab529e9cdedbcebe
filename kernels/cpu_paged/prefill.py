"""The C paged-prefill kernel (``kernels/_paged_prefill.c``) as a plain function on tensors.

``paged_prefill`` has the signature of ``AttentionBackend.paged_prefill_attention`` and no
state. It reads each sequence's K/V rows in place through its block table (no gather), one
work item per (sequence, KV head, tile of 48 query rows) with the query heads sharing the
KV head folded into the tile's rows, float32 online softmax, in an OpenMP team of the
calling thread's torch thread count. On a CPU with AVX-512 BF16, bfloat16 calls with
``head_dim`` a multiple of 32 take the ``vdpbf16ps`` path (``bf16_path()``); everything
else takes the portable path.

What the kernel takes: float32 or bfloat16 pools with the query in the pool's dtype, the
last query dimension contiguous, pools 4-byte aligned, ``head_dim`` ≤ ``MAX_HEAD_DIM``.
``supports`` says whether a call fits; the backend sends anything else (float16 pools, say)
to the torch reference.
"""

from __future__ import annotations

import torch

from kernels.errors import BackendUnavailable

try:
    from kernels import _paged_prefill as _ext
except ImportError as exc:  # not built (no compiler at install time): the backend refuses
    _ext = None  # type: ignore[assignment]
    _IMPORT_ERROR: str = str(exc)
else:
    _IMPORT_ERROR = ""

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
#: Scratch per thread grows with head_dim (~0.5 KiB per dim); no model needs more.
MAX_HEAD_DIM = 512
#: ``path=`` values: the best this CPU runs, or the portable C path (tests cover both).
PATH_BEST, PATH_PORTABLE = 0, 1


def require_extension() -> None:
    """Raise ``BackendUnavailable`` when the compiled kernel is not importable here."""
    if _ext is None:
        raise BackendUnavailable(f"kernels._paged_prefill is not built: {_IMPORT_ERROR}")


def bf16_path() -> bool:
    """Whether bfloat16 calls (``head_dim`` a multiple of 32) take the AVX-512 BF16 path."""
    return _ext is not None and bool(_ext.bf16_path())


def supports(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    """Whether the C kernel takes this call (else the caller uses the torch reference)."""
    return (_ext is not None and q.device.type == "cpu" and q.dtype in _DTYPES
            and k_pool.dtype == q.dtype and q.shape[2] <= MAX_HEAD_DIM
            and k_pool.data_ptr() % 4 == 0)


def paged_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    kv_start: torch.Tensor | None,
    *,
    path: int = PATH_BEST,
    tiles_per_item: int = 0,
) -> torch.Tensor:
    """``[tokens, heads, head_dim]``: the ragged chunks ``q[cu[b]:cu[b+1]]`` against their
    sequences' paged keys, on arguments ``kernels.checks`` validated and that ``supports``
    accepts. ``path`` and ``tiles_per_item`` (> 0: that many 48-row tiles per work item, at
    most 4) force what the kernel otherwise picks (tests)."""
    tokens, heads, head_dim = q.shape
    _, block_tokens, kv_heads, _ = k_pool.shape
    out = torch.empty((tokens, heads, head_dim), dtype=q.dtype)
    batch = block_tables.shape[0]
    if tokens == 0 or batch == 0:
        return out
    if q.stride(2) != 1:
        q = q.contiguous()
    if block_tables.stride(1) != 1:  # rows must be contiguous; a strided table is copied
        block_tables = block_tables.contiguous()
    # The per-sequence metadata is tiny: one int64 layout for the kernel.
    cu = cu_seqlens_q.to(torch.int64).contiguous()
    lens = seq_lens.to(torch.int64).contiguous()
    start = None if kv_start is None else kv_start.to(torch.int64).contiguous()
    _ext.paged_prefill(
        out.data_ptr(), q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
        block_tables.data_ptr(), cu.data_ptr(), lens.data_ptr(),
        0 if start is None else start.data_ptr(), q.stride(0), q.stride(1),
        block_tables.stride(0), batch, heads, kv_heads, head_dim, block_tokens, window or 0,
        _DTYPES[q.dtype], int(block_tables.dtype == torch.int64), float(scale), 0, path,
        tiles_per_item)
    return out
