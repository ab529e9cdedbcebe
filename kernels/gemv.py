"""The compiled bf16 skinny GEMM (``kernels/_gemv.c``) as a ``LinearKernel``: ``bf16gemv``.

Decode's linears read every weight once per step for a few rows, so their time is the
weights' bytes over DRAM bandwidth. ``prepare`` packs a weight once into the layout the
kernel's inner loop wants (``pack``: blocks of 16 output columns, each block contiguous with
its K pairs interleaved, so one 64-byte load feeds one ``_mm512_dpbf16_ps``); ``apply`` runs
the kernel on it for any row count (decode's few rows stream the weight once; a prefill's
many rows reuse each tile of blocks from L2), so the model keeps one prepared form.

Numerics: float32 accumulation over K in order, bias in float32, bfloat16 by
round-to-nearest-even. Each row's result is computed the same way whatever the other rows
and the thread count are, so the kernel is batch-invariant (``tests/kernels/test_gemv.py``
checks it); it is not bitwise ``F.linear`` (oneDNN sums in another order): rows agree to
bfloat16 rounding.

The kernel is handed out as a default only after ``run_selfcheck`` agreed with ``F.linear``
in float32 on this machine (once per process), and only where the CPU has AVX512-BF16
(``has_fast``); elsewhere its portable C path works but is slower than oneDNN, so it runs
only when forced (``KERNELS_LINEAR=bf16gemv``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch.nn import functional as F

try:
    from kernels import _gemv as _ext
except ImportError as exc:  # not built (no compiler at install time): never selected
    _ext = None  # type: ignore[assignment]
    IMPORT_ERROR: str = str(exc)
else:
    IMPORT_ERROR = ""

log = logging.getLogger(__name__)

#: Output columns per packed block (the kernel's vector width in float32 lanes).
BLOCK_COLUMNS = 16


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A ``[out_features, in_features]`` bf16 weight as ``[blocks, k_pairs, 16, 2]``."""

    data: torch.Tensor
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


def pack(weight: torch.Tensor) -> PackedWeight:
    """``packed[b, k, c, j] = weight[16 b + c, 2 k + j]``, zero where past the weight."""
    n, k = weight.shape
    blocks, pairs = -(-n // BLOCK_COLUMNS), -(-k // 2)
    w = weight.detach().to(torch.bfloat16)
    if (blocks * BLOCK_COLUMNS, pairs * 2) != (n, k):
        w = F.pad(w, (0, pairs * 2 - k, 0, blocks * BLOCK_COLUMNS - n))
    data = w.reshape(blocks, BLOCK_COLUMNS, pairs, 2).permute(0, 2, 1, 3).contiguous()
    return PackedWeight(data, n, k)


def linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None, *,
           threads: int = 0, portable: bool = False) -> torch.Tensor:
    """``x @ W.T + bias`` in bf16 for a 2-D bf16 ``x`` (any strides) on the CPU.
    ``threads`` 0: the calling thread's OpenMP count; ``portable``: skip the AVX512-BF16
    path (tests)."""
    m, k = x.shape
    if k != packed.in_features:
        raise ValueError(f"x has {k} features, the weight {packed.in_features}")
    out = torch.empty((m, packed.out_features), dtype=torch.bfloat16)
    if m == 0:
        return out
    b = 0
    if bias is not None:
        bias = bias.contiguous()
        b = bias.data_ptr()
    _ext.linear(out.data_ptr(), x.data_ptr(), packed.data.data_ptr(), b, m,
                packed.out_features, k, x.stride(0), x.stride(1), threads, portable)
    return out


def built() -> bool:
    """Whether the extension is importable here (any CPU: the portable path)."""
    return _ext is not None


def has_fast() -> bool:
    """Whether the extension is built and this CPU runs its AVX512-BF16 path."""
    return _ext is not None and bool(_ext.has_fast())


@dataclass(frozen=True, slots=True)
class SelfCheckResult:
    ok: bool
    worst_error_ratio: float  # ``error_ratio``'s worst: ≤ 1 is within bf16 rounding
    detail: str  # what disagreed, or "" when ok


def error_ratio(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None) -> float:
    """Worst |got − exact| over what bf16 output allows, computed in float64: half a bf16
    ulp of the exact value (the output's rounding) plus ``K`` float32 epsilons of
    ``|x| @ |W|.T + |b|`` (any summation order in float32). ≤ 1 is a correct result."""
    if got.numel() == 0:
        return 0.0
    xd, wd = x.double(), w.double()
    exact = xd @ wd.T + (0 if bias is None else bias.double())
    magnitude = xd.abs() @ wd.abs().T + (0 if bias is None else bias.double().abs())
    summed = x.shape[1] * 2.0**-23 * magnitude  # the float32 sum's error bound
    # Half an ulp where the float32 sum may land (it can cross into the next binade).
    half_ulp = torch.pow(2.0, torch.floor(torch.log2((exact.abs() + summed).clamp_min(1e-38)))
                         - 8)
    allowed = half_ulp + summed + 1e-38
    return float(((got.double() - exact).abs() / allowed).max())


@functools.cache
def run_selfcheck() -> SelfCheckResult:
    """Small ragged cases (rows 1, 3, 5, 12 and 17: one row group, two sharing K chunks, a
    prefill's groups; K and N off the tile, bias or none, strided x) against the exact
    product (float64); once per process."""
    if _ext is None:
        return SelfCheckResult(False, float("inf"), f"kernels._gemv is not built: {IMPORT_ERROR}")
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for m, n, k, with_bias in ((1, 37, 64, True), (3, 70, 33, False), (5, 128, 200, True),
                               (12, 100, 300, True), (17, 19, 96, True)):
        w = torch.randn(n, k, generator=gen).bfloat16()
        x = torch.randn(k, m, generator=gen).bfloat16().t()  # strided rows
        b = torch.randn(n, generator=gen).bfloat16() if with_bias else None
        err = error_ratio(linear(x, pack(w), b), x, w, b)
        worst = max(worst, err)
        if not err <= 1.0:  # also catches NaN
            return SelfCheckResult(False, err, f"m={m} n={n} k={k} bias={with_bias}: "
                                   f"error {err:.3g}x what bf16 rounding allows")
    return SelfCheckResult(True, worst, "")


@functools.cache
def usable_as_default() -> bool:
    """Built, the AVX512-BF16 path present and the self-check passed (the reason logged
    once when not)."""
    if not has_fast():
        reason = IMPORT_ERROR or "no AVX512-BF16 on this CPU"
        log.info("bf16gemv is not the default linear kernel: %s", reason)
        return False
    result = run_selfcheck()
    if not result.ok:
        log.warning("bf16gemv failed its self-check, oneDNN stays the default: %s",
                    result.detail)
    return result.ok
