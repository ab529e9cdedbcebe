"""A decode step's linears, back to back: each linear kernel against the DRAM read limit.

SmolLM2-135M's 121 products per step (30 layers × qkv 960×576, o 576×576, gate_up 3072×576,
down 576×1536, then lm_head 49152×576; 269 MB of bf16 weights), each with its own weight so
nothing is reused from cache, for ``rows`` rows (the requests in the step). Each kernel's
step time is set beside the time a plain float32 sum over 256 MiB takes to read the same
bytes (the machine's DRAM read rate, measured in the same interleaved rounds): the limit a
step of linears cannot beat. ``bench_kernels --ops linears`` prints it.

Run alone (``python -m bench.linear_step``) it can also time other builds of
``kernels/_gemv.c`` beside this one (``--ext``: an A/B of a kernel change in one process) and
rate every case by the calling thread's CPU time on one thread (``--cpu-time``: on a host
whose other tenants keep the cores busy, wall time measures the scheduler). A build for
``--ext`` carries its own module name, e.g. the main branch's kernel::

    git show main:kernels/_gemv.c | sed 's/PyInit__gemv(/PyInit__gemv_main(/; s/"_gemv",$/"_gemv_main",/' \
        > /tmp/_gemv_main.c
    gcc -shared -fPIC -O3 -std=gnu11 -fopenmp -I"$(python -c 'import sysconfig; \
        print(sysconfig.get_paths()["include"])')" -Ikernels /tmp/_gemv_main.c \
        -o /tmp/_gemv_main.so
    python -m bench.linear_step --ext /tmp/_gemv_main.so --kernels bf16gemv --cpu-time
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.harness import machine, median_interleaved, timed
from kernels import gemv
from kernels.linear import LINEAR_KERNELS, Bf16GemvLinear, LinearKernel

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


class ExternalGemv(Bf16GemvLinear):
    """Another build of ``kernels/_gemv.c`` (its module renamed) on the same packed weights."""

    def __init__(self, path: Path) -> None:
        module = path.name.split(".")[0]
        spec = importlib.util.spec_from_file_location(module, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"{path} is not an extension module")
        self.ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.ext)  # ImportError when PyInit_<module> is missing
        self.name = module

    def apply(self, x: torch.Tensor, prepared: object, bias: torch.Tensor | None
              ) -> torch.Tensor:
        assert isinstance(prepared, gemv.PackedWeight) and bias is None
        out = torch.empty((x.shape[0], prepared.out_features), dtype=torch.bfloat16)
        self.ext.linear(out.data_ptr(), x.data_ptr(), prepared.data.data_ptr(), 0, x.shape[0],
                        prepared.out_features, x.shape[1], x.stride(0), x.stride(1), 0, False)
        return out


def _cpu_timed(fn: Callable[[], object], repeat: int) -> float:
    """The calling thread's CPU seconds per call (one thread: all of the kernel's work)."""
    t0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t0) / repeat


def bench_linear_step(kernel_names: list[str], rows_list: list[int], runs: int,
                      gen: torch.Generator, extra: dict[str, LinearKernel] | None = None,
                      cpu_time: bool = False) -> list[StepRow]:
    """``kernel_names`` from ``LINEAR_KERNELS`` or ``extra``, the first the baseline."""
    weights = [torch.randn(n, k, generator=gen).bfloat16() for n, k in step_shapes()]
    nbytes = sum(w.numel() * 2 for w in weights)
    known = {**LINEAR_KERNELS, **(extra or {})}
    kernels: dict[str, LinearKernel] = {name: known[name] for name in kernel_names}
    timer = _cpu_timed if cpu_time else timed
    prepared = {name: [k.prepare(w) for w in weights] for name, k in kernels.items()}
    del weights  # only the prepared forms stay: the memory a model would hold
    big = torch.ones(SUM_BYTES // 4)
    out: list[StepRow] = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in (HIDDEN, 1536)}

        def step(kernel: LinearKernel, forms: list[object],
                 xs: dict[int, torch.Tensor] = xs) -> Callable[[], float]:
            def run() -> float:
                return timer(lambda: [kernel.apply(xs[k], p, None)
                                      for (_, k), p in zip(step_shapes(), forms, strict=True)],
                             REPEAT)
            return run

        cases = {name: step(k, prepared[name]) for name, k in kernels.items()}
        cases["dram"] = lambda: timer(lambda: big.sum(), REPEAT) * nbytes / SUM_BYTES
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.linear_step",
        description="A SmolLM2-135M decode step's 121 linears, per linear kernel, against the "
                    "DRAM read limit; optionally beside other builds of kernels/_gemv.c.")
    p.add_argument("--kernels", default="bf16gemv",
                   help=f"of {', '.join(LINEAR_KERNELS)} (default %(default)s); the --ext "
                        "builds are timed first, the first of all the baseline")
    p.add_argument("--ext", default="", help="comma-separated paths of other _gemv builds, "
                   "each with its own module name (the file name up to its first dot)")
    p.add_argument("--rows", default="1,2,4,8,16,32", help="default %(default)s")
    p.add_argument("--runs", type=int, default=5, help="interleaved rounds (default %(default)s)")
    p.add_argument("--cpu-time", action="store_true",
                   help="one thread, rated by its CPU time (for a loaded host)")
    args = p.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        names = [n for n in args.kernels.split(",") if n]
        unknown = [n for n in names if n not in LINEAR_KERNELS]
        if unknown or min(rows) < 1 or args.runs < 1:
            raise ValueError(f"unknown kernel {unknown}" if unknown else "rows and runs must be "
                             "positive")
        extra = {k.name: k for k in (ExternalGemv(Path(e)) for e in args.ext.split(",") if e)}
    except (ValueError, ImportError, OSError) as exc:
        print(f"linear_step: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    if args.cpu_time:
        torch.set_num_threads(1)
    names = [*extra, *names]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{machine()}, {torch.get_num_threads()} threads, "
          f"{'CPU' if args.cpu_time else 'wall'} time, load {load}")
    print(f"| kernel | rows | step ms | GB/s | / DRAM limit | / {names[0]} |")
    print("|---|---|---|---|---|---|")
    for r in bench_linear_step(names, rows, args.runs, torch.Generator().manual_seed(0), extra,
                               args.cpu_time):
        print(f"| {r.kernel} | {r.rows} | {r.step_s * 1e3:.2f} | {r.gb_per_s:.1f} | "
              f"{r.vs_dram:.2f} | {r.vs_first:.2f} |", flush=True)
    print(f"load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
