"""The prefill-kernel table of ``bench.bench_kernels``: ``cpu_paged``'s C prefill kernel
against the torch backend (ATen's CPU flash kernel over gathered chunks), same calls, same
interleaved rounds.

Cases: a 2 048-token causal prefill (2 K × 2 K) and a 2 048-token chunk after 4 096 cached
tokens, on the attention shapes of SmolLM2-135M (9 query / 3 KV heads × 64) and Gemma 3
270M (4 / 1 × 256, sliding window 512), at 1 and 2 threads, in shuffled 16-token pool
blocks (the engine's block size). GFLOP/s counts the useful work only: 4 × heads ×
head_dim per visible (query, key) pair. Each figure is a median of interleaved rounds, in
wall time and in the process's CPU time (on a shared machine the wall figure includes
waiting for a core; the CPU figure is the work's own speed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import kernels
from bench.harness import median_interleaved

BLOCK_TOKENS = 16
#: name → (heads, kv_heads, head_dim, window)
SHAPES: dict[str, tuple[int, int, int, int | None]] = {
    "smollm2": (9, 3, 64, None),
    "gemma3": (4, 1, 256, 512),
}
#: name → (chunk tokens, cached tokens before it)
CASES: dict[str, tuple[int, int]] = {"2K x 2K causal": (2048, 0), "2K after 4K": (2048, 4096)}
BACKENDS = ("torch", "cpu_paged")


@dataclass(frozen=True, slots=True)
class PrefillRow:
    shape: str
    case: str
    dtype: str
    threads: int
    gflop: float
    wall_s: dict[str, float]  # backend → median seconds
    cpu_s: dict[str, float]
    max_abs_diff: float

    def gflops(self, backend: str, clock: str = "wall") -> float:
        t = (self.wall_s if clock == "wall" else self.cpu_s)[backend]
        return self.gflop / t

    @property
    def speedup(self) -> float:
        return self.wall_s["torch"] / self.wall_s["cpu_paged"]

    @property
    def cpu_speedup(self) -> float:
        return self.cpu_s["torch"] / self.cpu_s["cpu_paged"]


def _visible_pairs(q_len: int, seq_len: int, window: int | None) -> int:
    first = seq_len - q_len
    return sum(min(p + 1, window or p + 1) for p in range(first, seq_len))


def _case(shape: str, case: str, dtype: torch.dtype, gen: torch.Generator):
    heads, kv_heads, dim, window = SHAPES[shape]
    q_len, cached = CASES[case]
    seq = q_len + cached
    blocks = -(-seq // BLOCK_TOKENS)
    k = torch.randn(blocks, BLOCK_TOKENS, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(blocks, BLOCK_TOKENS, kv_heads, dim, generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen).view(1, blocks).to(torch.int32)
    q = torch.randn(q_len, heads, dim, generator=gen).to(dtype)
    args = (q, k, v, torch.tensor([0, q_len], dtype=torch.int32), tables,
            torch.tensor([seq], dtype=torch.int32), dim**-0.5)
    gflop = 4 * heads * dim * _visible_pairs(q_len, seq, window) / 1e9
    return args, window, gflop


def _clocked(fn: Callable[[], object], store: list[float]) -> Callable[[], float]:
    def run() -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        store.append(time.process_time() - c0)
        return wall
    return run


def bench_case(shape: str, case: str, dtype_name: str, dtype: torch.dtype, threads: int,
               runs: int, gen: torch.Generator) -> PrefillRow:
    args, window, gflop = _case(shape, case, dtype, gen)
    calls = {name: (lambda name=name: kernels.paged_prefill_attention(
        *args, window=window, backend=name, validated=True)) for name in BACKENDS}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = {name: fn() for name, fn in calls.items()}  # warm-up, and the outputs
        cpu: dict[str, list[float]] = {name: [] for name in BACKENDS}
        wall = median_interleaved({name: _clocked(fn, cpu[name])
                                   for name, fn in calls.items()}, runs)
    finally:
        torch.set_num_threads(before)
    diff = (outs["torch"].float() - outs["cpu_paged"].float()).abs().max().item()
    cpu_med = {name: sorted(v)[len(v) // 2] for name, v in cpu.items()}
    return PrefillRow(shape, case, dtype_name, threads, gflop, wall, cpu_med, diff)


def run_table(dtypes: dict[str, torch.dtype], threads: list[int], runs: int,
              gen: torch.Generator, out: Callable[[str], None] = print) -> list[PrefillRow]:
    out("| shape | case | dtype | threads | torch s | cpu_paged s | torch GFLOP/s "
        "| cpu_paged GFLOP/s | speed-up | CPU-time GFLOP/s torch / cpu_paged | CPU speed-up "
        "| max abs diff |")
    out("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in SHAPES:
        for case in CASES:
            for name, dtype in dtypes.items():
                for n in threads:
                    r = bench_case(shape, case, name, dtype, n, runs, gen)
                    rows.append(r)
                    out(f"| {shape} | {case} | {name} | {n} | {r.wall_s['torch']:.3f} | "
                        f"{r.wall_s['cpu_paged']:.3f} | {r.gflops('torch'):.1f} | "
                        f"{r.gflops('cpu_paged'):.1f} | {r.speedup:.2f}x | "
                        f"{r.gflops('torch', 'cpu'):.1f} / {r.gflops('cpu_paged', 'cpu'):.1f} | "
                        f"{r.cpu_speedup:.2f}x | {r.max_abs_diff:.1e} |")
    return rows
