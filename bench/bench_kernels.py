"""CPU: the paged attention backends against SDPA on contiguous KV (the cost of paging).

The same sequences are laid out twice: scattered over shuffled 64-token pool blocks for
``kernels`` (backend ``torch``), and contiguous for ``torch.nn.functional.
scaled_dot_product_attention``. The baseline is the fastest SDPA call a user would make
on contiguous KV: causal prefill with ``is_causal=True`` (grouped-query heads through
``enable_gqa`` or repeated KV, whichever is faster here), decode with each KV head's
query group as rows (``q.view(B, kv_heads, group, D)``, no mask) or ``enable_gqa``.
Shapes: 8 query heads, 2 KV heads, head_dim 64 (the small preset). Every figure is the
median of interleaved rounds; the ratio is paged / SDPA (lower is better; 1 = no cost).
Decode also runs each backend of ``--decode-backends`` (default ``torch,cpu_paged``: the
reference and the compiled kernel) in the same interleaved rounds, one row each, with its
time against the torch backend's beside it.

``--ops linears`` times a decode step's linears instead (``bench/linear_step.py``: SmolLM2-135M's
121 bf16 products back to back, each linear kernel of ``--linear-kernels`` for each row count
of ``--linear-rows``, against the DRAM read limit from the same rounds).

``--ops prefill-kernel`` prints a second table (``bench/prefill_table.py``): ``cpu_paged``'s
C prefill kernel against the torch backend in GFLOP/s, on SmolLM2's and Gemma 3's attention
shapes, 2 K x 2 K causal and a 2 K chunk after 4 K cached, at ``--prefill-threads``.

``python -m bench.bench_kernels [--contexts 4096,32768] [--dtypes bf16,fp32]
[--decode-batch 8] [--decode-backends torch,cpu_paged] [--runs 3] [--json PATH]
[--ops prefill,decode,linears,prefill-kernel] [--linear-rows 1,2,4,8]
[--linear-kernels onednn,bf16gemv] [--prefill-threads 1,2]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import kernels
from bench.harness import machine, median_interleaved, timed
from bench.prefill_table import run_table

HEADS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS = 8, 2, 64, 64
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


@dataclass(frozen=True, slots=True)
class Row:
    op: str
    backend: str
    dtype: str
    context_tokens: int
    batch: int
    paged_s: float
    sdpa_s: float
    sdpa_call: str
    ratio: float
    vs_torch: float  # this backend's time / the torch backend's, same rounds
    max_abs_diff: float


@dataclass
class Layout:
    """``batch`` sequences of ``tokens`` each: paged (shuffled blocks) and contiguous."""

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    k: torch.Tensor  # [batch, kv_heads, tokens, D]
    v: torch.Tensor


def layout(batch: int, tokens: int, dtype: torch.dtype, gen: torch.Generator) -> Layout:
    per_seq = -(-tokens // BLOCK_TOKENS)
    blocks = batch * per_seq
    k_pool = torch.randn(blocks, BLOCK_TOKENS, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v_pool = torch.randn(blocks, BLOCK_TOKENS, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen).view(batch, per_seq).to(torch.int32)

    def contiguous(pool: torch.Tensor) -> torch.Tensor:
        seqs = pool[tables.long()].view(batch, -1, KV_HEADS, HEAD_DIM)[:, :tokens]
        return seqs.permute(0, 2, 1, 3).contiguous()

    return Layout(k_pool, v_pool, tables,
                  torch.full((batch,), tokens, dtype=torch.int32),
                  contiguous(k_pool), contiguous(v_pool))


def _timed(fn: Callable[[], object]) -> Callable[[], float]:
    return lambda: timed(fn)


def compare(op: str, dtype_name: str, tokens: int, batch: int,
            paged: dict[str, Callable[[], torch.Tensor]],
            baselines: dict[str, Callable[[], torch.Tensor]], runs: int) -> list[Row]:
    """One row per paged backend (``paged`` holds ``torch`` first), all timed in the same
    interleaved rounds as the SDPA baselines."""
    cases = ({f"paged {name}": _timed(fn) for name, fn in paged.items()}
             | {name: _timed(fn) for name, fn in baselines.items()})
    medians = median_interleaved(cases, runs)
    best = min(baselines, key=lambda name: medians[name])
    rows = []
    for name, fn in paged.items():
        got = fn()
        diffs = [(got.float() - other().float()).abs().max().item()
                 for other in [*baselines.values(), paged["torch"]]]
        t = medians[f"paged {name}"]
        rows.append(Row(op, name, dtype_name, tokens, batch, t, medians[best], best,
                        t / medians[best], t / medians["paged torch"], max(diffs)))
    return rows


def bench_prefill(dtype_name: str, tokens: int, runs: int, gen: torch.Generator) -> list[Row]:
    dtype = DTYPES[dtype_name]
    lay = layout(1, tokens, dtype, gen)
    q = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen).to(dtype)
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    qh = q.permute(1, 0, 2).unsqueeze(0)  # [1, H, S, D]
    group = HEADS // KV_HEADS

    def paged() -> torch.Tensor:
        return kernels.paged_prefill_attention(q, lay.k_pool, lay.v_pool, cu, lay.block_tables,
                                               lay.seq_lens, scale, backend="torch")

    def sdpa(o: torch.Tensor) -> torch.Tensor:
        return o[0].permute(1, 0, 2)

    baselines = {
        "sdpa is_causal enable_gqa": lambda: sdpa(F.scaled_dot_product_attention(
            qh, lay.k, lay.v, is_causal=True, scale=scale, enable_gqa=True)),
        "sdpa is_causal repeated kv": lambda: sdpa(F.scaled_dot_product_attention(
            qh, lay.k.repeat_interleave(group, 1), lay.v.repeat_interleave(group, 1),
            is_causal=True, scale=scale)),
    }
    return compare("prefill", dtype_name, tokens, 1, {"torch": paged}, baselines, runs)


def bench_decode(dtype_name: str, tokens: int, batch: int, runs: int,
                 gen: torch.Generator, backends: list[str]) -> list[Row]:
    dtype = DTYPES[dtype_name]
    lay = layout(batch, tokens, dtype, gen)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to(dtype)
    scale = HEAD_DIM**-0.5
    group = HEADS // KV_HEADS

    def paged(backend: str) -> Callable[[], torch.Tensor]:
        return lambda: kernels.paged_decode_attention(
            q, lay.k_pool, lay.v_pool, lay.block_tables, lay.seq_lens, scale, backend=backend,
            validated=True)

    baselines = {
        "sdpa group rows": lambda: F.scaled_dot_product_attention(
            q.view(batch, KV_HEADS, group, HEAD_DIM), lay.k, lay.v, scale=scale,
        ).reshape(batch, HEADS, HEAD_DIM),
        "sdpa enable_gqa": lambda: F.scaled_dot_product_attention(
            q.unsqueeze(2), lay.k, lay.v, scale=scale, enable_gqa=True,
        ).squeeze(2),
    }
    named = {name: paged(name) for name in ["torch", *[b for b in backends if b != "torch"]]}
    return compare("decode", dtype_name, tokens, batch, named, baselines, runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="4096,32768", help="tokens (default %(default)s)")
    p.add_argument("--dtypes", default="bf16,fp32", help="default %(default)s")
    p.add_argument("--decode-batch", type=int, default=8, help="default %(default)s")
    p.add_argument("--runs", type=int, default=3, help="interleaved rounds (default %(default)s)")
    p.add_argument("--ops", default="prefill,decode",
                   help="prefill, decode (paged vs SDPA, per context) and prefill-kernel "
                        "(the C prefill kernel vs the torch backend, its own table); or "
                        "linears alone (a decode step's products); default %(default)s")
    p.add_argument("--prefill-threads", default="1,2",
                   help="thread counts of the prefill-kernel table (default %(default)s)")
    p.add_argument("--decode-backends", default="torch,cpu_paged",
                   help="attention backends timed on decode, each against SDPA and torch "
                        "(default %(default)s)")
    p.add_argument("--linear-rows", default="1,2,4,8", help="default %(default)s")
    p.add_argument("--linear-kernels", default="onednn,bf16gemv",
                   help="linear kernels timed by --ops linears, the first the baseline "
                        "(default %(default)s)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    if "linears" in ops:
        return _linears(args, [op for op in ops if op != "linears"])
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
        dtypes = args.dtypes.split(",")
        backends = args.decode_backends.split(",")
        ops = args.ops.split(",")
        threads = [int(n) for n in args.prefill_threads.split(",")]
        unknown = [op for op in ops if op not in ("prefill", "decode", "prefill-kernel")]
        if unknown or min(threads) < 1:
            raise ValueError(f"unknown op {unknown}" if unknown else "threads must be >= 1")
        for name in [*backends, *(["cpu_paged"] if "prefill-kernel" in ops else [])]:
            kernels.get_backend(name)
        bad = [d for d in dtypes if d not in DTYPES]
        if bad or min(contexts) < 1 or args.runs < 1 or args.decode_batch < 1:
            raise ValueError(f"unknown dtype {bad}" if bad else "sizes must be positive")
    except (ValueError, kernels.BackendUnavailable) as exc:
        print(f"bench_kernels: {exc}", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    print(f"{machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows: list[Row] = []
    table = []
    if "prefill-kernel" in ops:
        table = run_table({d: DTYPES[d] for d in dtypes}, threads, args.runs, gen)
        ops = [op for op in ops if op != "prefill-kernel"]
    if not ops:
        return _dump(args.json, rows, table)
    print("| op | backend | dtype | context | batch | paged s | SDPA s | SDPA call "
          "| paged / SDPA | / torch | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tokens in contexts:
        for dtype_name in dtypes:
            for op in ops:
                if op == "prefill":
                    new = bench_prefill(dtype_name, tokens, args.runs, gen)
                else:
                    new = bench_decode(dtype_name, tokens, args.decode_batch, args.runs, gen,
                                       backends)
                rows.extend(new)
                for row in new:
                    print(f"| {row.op} | {row.backend} | {row.dtype} | {row.context_tokens} | "
                          f"{row.batch} | {row.paged_s:.4f} | {row.sdpa_s:.4f} | "
                          f"{row.sdpa_call} | {row.ratio:.2f} | {row.vs_torch:.2f} | "
                          f"{row.max_abs_diff:.1e} |", flush=True)
    return _dump(args.json, rows, table)


def _dump(path: str | None, rows: list[Row], table: list) -> int:
    if path:
        with open(path, "w") as f:
            json.dump({"machine": machine(), "rows": [asdict(r) for r in rows],
                       "prefill_kernel": [asdict(r) for r in table]}, f, indent=1)
    return 0


def _linears(args: argparse.Namespace, other_ops: list[str]) -> int:
    from bench.linear_step import bench_linear_step
    from kernels.linear import LINEAR_KERNELS

    names = args.linear_kernels.split(",")
    try:
        rows = [int(r) for r in args.linear_rows.split(",")]
        if other_ops or min(rows) < 1 or args.runs < 1:
            raise ValueError("--ops linears runs alone, with positive rows and runs")
        unknown = [n for n in names if n not in LINEAR_KERNELS]
        if unknown:
            raise ValueError(f"unknown linear kernel {unknown}: choose from "
                             f"{', '.join(LINEAR_KERNELS)}")
    except ValueError as exc:
        print(f"bench_kernels: {exc}", file=sys.stderr)
        return 2
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {load}")
    print(f"| kernel | rows | step ms | weights MB | GB/s | / DRAM limit | / {names[0]} |")
    print("|---|---|---|---|---|---|---|")
    out = bench_linear_step(names, rows, args.runs, torch.Generator().manual_seed(0))
    for r in out:
        print(f"| {r.kernel} | {r.rows} | {r.step_s * 1e3:.2f} | {r.weight_mb:.0f} | "
              f"{r.gb_per_s:.1f} | {r.vs_dram:.2f} | {r.vs_first:.2f} |", flush=True)
    print(f"load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "rows": [asdict(r) for r in out]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
