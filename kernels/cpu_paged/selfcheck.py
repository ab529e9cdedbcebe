"""The start-up checks that decide whether the C kernels may serve the CPU.

A build on another machine, a compiler that mis-vectorises, a libgomp clash: each would
show as wrong numbers, not an import error. So before the backend is handed out, a few
small shuffled-pool cases (ragged lengths, a window, ``kv_start``, forced key splits, both
dtypes, both of the decode kernel's paths: the AVX-512 BF16 one where the CPU has it, and
the portable one) run through the kernel and the torch reference, and must agree. The prefill
kernel's check (``run_prefill_selfcheck``) does the same with ragged chunks after cached
prefixes, one-token chunks, a window, ``kv_start`` and both of its paths (the AVX-512 BF16
one where the CPU has it, and the portable one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.cpu_paged import decode, prefill
from kernels.torch_ref.attention import paged_prefill as reference_prefill
from kernels.torch_ref.decode import paged_decode as reference_decode

#: Agreement the check asks for, per dtype (the reference rounds bfloat16 at other places).
TOLERANCE: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@dataclass(frozen=True, slots=True)
class SelfCheckResult:
    ok: bool
    worst_abs_error: float
    detail: str  # what disagreed, or "" when ok


def _case(dtype: torch.dtype, gen: torch.Generator, heads: int = 6, kv_heads: int = 2,
          dim: int = 64, bt: int = 16, lens: tuple[int, ...] | list[int] = (1, 37, 300, 16)):
    lens = list(lens)
    need = [-(-n // bt) for n in lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lens), max(need)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k = torch.randn(num_blocks, bt, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, bt, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    return q, k, v, tables, torch.tensor(lens, dtype=torch.int32)


def run_selfcheck() -> SelfCheckResult:
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for dtype, tol in TOLERANCE.items():
        q, k, v, tables, lens = _case(dtype, gen)
        kv_start = torch.tensor([0, 5, 40, 3], dtype=torch.int32)
        for window, start, splits in ((None, None, 0), (100, kv_start, 0), (None, kv_start, 3)):
            want = reference_decode(q, k, v, tables, lens, 0.125, window, start)
            for path in (decode.PATH_BEST, decode.PATH_PORTABLE):
                got = decode.paged_decode(q, k, v, tables, lens, 0.125, window, start,
                                          splits=splits, path=path)
                err = float((got.float() - want.float()).abs().max())
                worst = max(worst, err)
                if not err <= tol:  # also catches NaN
                    return SelfCheckResult(False, err, f"{dtype}, window={window}, "
                                           f"kv_start={start is not None}, splits={splits}, "
                                           f"path={path}: max |error| {err:.3g} > {tol}")
    return SelfCheckResult(True, worst, "")


def _prefill_case(dtype: torch.dtype, gen: torch.Generator):
    # head_dim 64 (a multiple of 32) so bfloat16 takes the AVX-512 BF16 path where it runs.
    heads, kv_heads, dim, bt = 6, 2, 64, 16
    lens, q_lens = [70, 1, 130, 40], [70, 1, 33, 1]
    q, k, v, tables, seq_lens = _case(dtype, gen, heads, kv_heads, dim, bt, lens)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu, tables, seq_lens


def _one_thread(fn, *args):  # type: ignore[no-untyped-def]
    """The reference's many small ops on one thread: on a loaded host a 2-thread team
    waits at every op's barrier (seconds of start-up), and the numbers do not change."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def run_prefill_selfcheck() -> SelfCheckResult:
    """The prefill kernel against the reference (ragged chunks after cached prefixes)."""
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    paths = (prefill.PATH_BEST, prefill.PATH_PORTABLE)
    for dtype, tol in TOLERANCE.items():
        q, k, v, cu, tables, lens = _prefill_case(dtype, gen)
        kv_start = torch.tensor([0, 0, 90, 5], dtype=torch.int32)
        for window, start in ((None, None), (24, kv_start)):
            want = _one_thread(reference_prefill, q, k, v, cu, tables, lens, 0.125, window,
                               start)
            for path in paths:
                got = prefill.paged_prefill(q, k, v, cu, tables, lens, 0.125, window, start,
                                            path=path)
                err = float((got.float() - want.float()).abs().max())
                worst = max(worst, err)
                if not err <= tol:  # also catches NaN
                    return SelfCheckResult(False, err, f"prefill {dtype}, window={window}, "
                                           f"kv_start={start is not None}, path={path}: "
                                           f"max |error| {err:.3g} > {tol}")
    return SelfCheckResult(True, worst, "")
