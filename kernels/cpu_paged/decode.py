"""The C paged-decode kernel (``kernels/_paged_decode.c``) as a plain function on tensors.

``paged_decode`` has the signature of ``AttentionBackend.paged_decode_attention`` and no
state, so it can later be wrapped as an opaque custom op inside a ``torch.compile``d layer.
It reads each sequence's K/V blocks in place through its block table (no gather into
scratch), one work item per (sequence, KV head) with its whole query group, float32
online softmax, in an OpenMP team of the calling thread's torch thread count.

On a CPU with AVX-512 BF16, bfloat16 calls with ``head_dim`` a multiple of 32 take the
``vdpbf16ps`` path (``bf16_path()``: keys 16 at a time, the pool's bf16 rows used in place,
P rounded to bf16 for P·V); everything else takes the portable float32 path. ``path=``
forces the portable one (tests, and the engine A/B through ``CpuPagedPortableBackend``).

What the kernel takes: float32 or bfloat16 pools and queries, a query group of at most
``MAX_GROUP`` heads and ``head_dim`` of at most ``MAX_HEAD_DIM``. ``supports`` says whether a
call fits; the backend sends anything else (float16 pools, say) to the torch reference.
"""

from __future__ import annotations

import torch

from kernels.errors import BackendUnavailable

try:
    from kernels import _paged_decode as _ext
except ImportError as exc:  # not built (no compiler at install time): the backend refuses
    _ext = None  # type: ignore[assignment]
    _IMPORT_ERROR: str = str(exc)
else:
    _IMPORT_ERROR = ""

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_LIMITS = _ext.limits() if _ext is not None else {"max_group": 0, "max_head_dim": 0}
MAX_GROUP: int = _LIMITS["max_group"]
MAX_HEAD_DIM: int = _LIMITS["max_head_dim"]
#: ``path=`` values: the best this CPU runs, or the portable C path (tests cover both).
PATH_BEST, PATH_PORTABLE = 0, 1


def require_extension() -> None:
    """Raise ``BackendUnavailable`` when the compiled kernel is not importable here."""
    if _ext is None:
        raise BackendUnavailable(f"kernels._paged_decode is not built: {_IMPORT_ERROR}")


def bf16_path() -> bool:
    """Whether bfloat16 calls (``head_dim`` a multiple of 32) take the AVX-512 BF16 path."""
    return _ext is not None and bool(_ext.bf16_path())


def supports(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    """Whether the C kernel takes this call (else the caller uses the torch reference)."""
    return (_ext is not None and q.device.type == "cpu" and q.dtype in _DTYPES
            and k_pool.dtype == q.dtype and q.shape[1] // k_pool.shape[2] <= MAX_GROUP
            and q.shape[2] <= MAX_HEAD_DIM)


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    kv_start: torch.Tensor | None,
    *,
    splits: int = 0,
    path: int = PATH_BEST,
) -> torch.Tensor:
    """``[batch, heads, head_dim]`` attention of each sequence's one query over its paged
    keys, on arguments ``kernels.checks`` validated and that ``supports`` accepts.
    ``splits`` > 0 forces the number of key splits per (sequence, KV head) (tests);
    ``path`` (``PATH_PORTABLE``) forces the portable item path."""
    batch, heads, head_dim = q.shape
    _, block_tokens, kv_heads, _ = k_pool.shape
    out = torch.empty((batch, heads, head_dim), dtype=q.dtype)
    if batch == 0:
        return out
    if q.stride(2) != 1:  # the kernel reads a head's dims as one run
        q = q.contiguous()
    index = block_tables.dtype
    if block_tables.stride(1) != 1:  # rows must be contiguous; a strided row is copied
        block_tables = block_tables.contiguous()
    # One index width for the three index tensors (the engine passes them alike).
    lens = seq_lens if seq_lens.dtype == index else seq_lens.to(index)
    lens = lens.contiguous()
    start = None
    if kv_start is not None:
        start = (kv_start if kv_start.dtype == index else kv_start.to(index)).contiguous()
    _ext.paged_decode(
        out.data_ptr(), q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
        block_tables.data_ptr(), lens.data_ptr(), 0 if start is None else start.data_ptr(),
        q.stride(0), q.stride(1), block_tables.stride(0), batch, heads, kv_heads, head_dim,
        block_tokens, window or 0, _DTYPES[q.dtype], int(index == torch.int64), float(scale),
        0, splits, path)
    return out
