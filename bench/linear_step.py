"""A decode step's linears, back to back: each linear kernel against the DRAM read limit.

SmolLM2-135M's 121 products per step (30 layers × qkv 960×576, o 576×576, gate_up 3072×576,
down 576×1536, then lm_head 49152×576; 269 MB of bf16 weights), each with its own weight so
nothing is reused from cache, for ``rows`` rows (the requests in the step). Each kernel's
step time is set beside the time a plain float32 sum over 256 MiB takes to read the same
bytes (the machine's DRAM read rate, measured in the same interleaved rounds): the limit a
step of linears cannot beat. ``bench_kernels --ops linears`` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.harness import median_interleaved, timed
from kernels.linear import LINEAR_KERNELS, LinearKernel

LAYERS = 30
HIDDEN = 576
#: (out_features, in_features) of one layer's products, then the head's.
LAYER_SHAPES = ((960, HIDDEN), (HIDDEN, HIDDEN), (3072, HIDDEN), (HIDDEN, 1536))
HEAD_SHAPE = (49152, HIDDEN)
SUM_BYTES = 256 << 20
REPEAT = 3  # steps per timed figure


@dataclass(frozen=True, slots=True)
class StepRow:
    kernel: str
    rows: int
    step_s: float
    weight_mb: float
    gb_per_s: float
    vs_dram: float  # step time / the DRAM read limit's time for the same bytes (≥ 1)
    vs_first: float  # step time / the first kernel's, same rounds


def step_shapes() -> list[tuple[int, int]]:
    return [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [HEAD_SHAPE]


def bench_linear_step(kernel_names: list[str], rows_list: list[int], runs: int,
                      gen: torch.Generator) -> list[StepRow]:
    weights = [torch.randn(n, k, generator=gen).bfloat16() for n, k in step_shapes()]
    nbytes = sum(w.numel() * 2 for w in weights)
    kernels: dict[str, LinearKernel] = {name: LINEAR_KERNELS[name] for name in kernel_names}
    prepared = {name: [k.prepare(w) for w in weights] for name, k in kernels.items()}
    del weights  # only the prepared forms stay: the memory a model would hold
    big = torch.ones(SUM_BYTES // 4)
    out: list[StepRow] = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in (HIDDEN, 1536)}

        def step(kernel: LinearKernel, forms: list[object],
                 xs: dict[int, torch.Tensor] = xs) -> Callable[[], float]:
            def run() -> float:
                return timed(lambda: [kernel.apply(xs[k], p, None)
                                      for (_, k), p in zip(step_shapes(), forms, strict=True)],
                             REPEAT)
            return run

        cases = {name: step(k, prepared[name]) for name, k in kernels.items()}
        cases["dram"] = lambda: timed(lambda: big.sum(), REPEAT) * nbytes / SUM_BYTES
        for case in cases.values():  # warm-up: oneDNN builds its primitives on first use
            case()
        med = median_interleaved(cases, runs)
        first = med[kernel_names[0]]
        for name in kernel_names:
            out.append(StepRow(name, rows, med[name], nbytes / 1e6, nbytes / med[name] / 1e9,
                               med[name] / med["dram"], med[name] / first))
        out.append(StepRow("fp32 sum (DRAM limit)", rows, med["dram"], nbytes / 1e6,
                           nbytes / med["dram"] / 1e9, 1.0, med["dram"] / first))
    return out
