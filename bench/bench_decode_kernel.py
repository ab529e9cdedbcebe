"""The C paged-decode kernel alone: its AVX-512 BF16 path against its portable path and
against reading the same bytes, in the same interleaved rounds.

A case is ``--batch`` sequences of ``--context`` tokens in shuffled ``--block``-token pool
blocks (``--heads`` query heads over ``--kv-heads`` KV heads of ``--head-dim``), one decode
query each, bfloat16. Each round times ``--calls`` calls of each peer, in turn:

- ``best``: ``paged_decode`` as the engine calls it (the AVX-512 BF16 path where the CPU
  has it);
- ``portable``: the same call forced onto the portable path (the kernel before that path);
- ``read``: a float32 ``sum`` over a buffer of the bytes the call's K and V rows occupy:
  what reading them costs at this machine's memory rate, the floor the kernel aims at.

With ``--layers N`` (default 32) every peer rotates over N copies of its data, one per
call, as a model's layers do: N × the bytes exceeds the last-level cache, so each call
reads from DRAM as in an engine step (``--layers 1``: the same copy, cache-warm). Figures
are medians over ``--runs`` rounds of the per-call time; the ratios come from the same
rounds. Threads: ``--threads`` (torch's, which the kernel's OpenMP team follows);
``--cpu-time`` (one thread) times by the calling thread's CPU time instead of wall time.

``python -m bench.bench_decode_kernel [--batch 8] [--context 600] [--heads 9] [--kv-heads 3]
[--head-dim 64] [--block 64] [--threads 2] [--calls 200] [--runs 5] [--layers 32]
[--cpu-time]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from bench.harness import machine
from kernels.cpu_paged import decode


def _case(args: argparse.Namespace, gen: torch.Generator):
    bt, n = args.block, args.context
    per = -(-n // bt)
    blocks = args.batch * per
    perm = torch.randperm(blocks, generator=gen).to(torch.int32)
    tables = perm.reshape(args.batch, per).contiguous()
    shape = (blocks, bt, args.kv_heads, args.head_dim)
    k = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(torch.bfloat16)
    q = torch.randn(args.batch, args.heads, args.head_dim, generator=gen).to(torch.bfloat16)
    lens = torch.full((args.batch,), n, dtype=torch.int32)
    return q, k, v, tables, lens


def _per_call(fn, layers: list, calls: int, clock) -> float:  # type: ignore[no-untyped-def]
    t0 = clock()
    for i in range(calls):
        fn(layers[i % len(layers)])
    return (clock() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_decode_kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("batch", 8), ("context", 600), ("heads", 9), ("kv-heads", 3),
                          ("head-dim", 64), ("block", 64), ("threads", 2), ("calls", 200),
                          ("runs", 5), ("layers", 32)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--cpu-time", action="store_true",
                   help="time by this thread's CPU time (needs --threads 1): on a host whose "
                        "other tenants keep the cores busy, wall time measures the scheduler")
    args = p.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        print("bench_decode_kernel: --cpu-time needs --threads 1", file=sys.stderr)
        return 2
    clock = time.thread_time if args.cpu_time else time.perf_counter
    if min(args.batch, args.context, args.kv_heads, args.block, args.threads, args.calls,
           args.runs, args.layers) < 1 or args.heads % args.kv_heads or args.head_dim % 32:
        print("bench_decode_kernel: positive sizes, heads a multiple of kv-heads, head-dim a "
              "multiple of 32", file=sys.stderr)
        return 2
    decode.require_extension()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    layers = [_case(args, gen) for _ in range(args.layers)]
    kv_bytes = args.batch * args.context * args.kv_heads * args.head_dim * 2 * 2
    reads = [torch.randn(kv_bytes // 4, generator=gen) for _ in range(args.layers)]
    scale = args.head_dim ** -0.5

    def call(path: int):  # type: ignore[no-untyped-def]
        return lambda c: decode.paged_decode(c[0], c[1], c[2], c[3], c[4], scale, None, None,
                                             path=path)

    best, portable = call(decode.PATH_BEST), call(decode.PATH_PORTABLE)
    err = (best(layers[0]).float() - portable(layers[0]).float()).abs().max().item()
    peers = {"best": (best, layers), "portable": (portable, layers),
             "read": (lambda x: x.sum(), reads)}
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    times: dict[str, list[float]] = {name: [] for name in peers}
    for r in range(args.runs):
        order = list(peers) if r % 2 == 0 else list(peers)[::-1]
        for name in order:
            fn, data = peers[name]
            _per_call(fn, data, max(1, args.calls // 10), clock)  # warm its code and data
            times[name].append(_per_call(fn, data, args.calls, clock))
    load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    med = {name: statistics.median(ts) * 1e6 for name, ts in times.items()}
    print(f"# paged decode kernel, bf16: {machine()}; {args.batch} × {args.context} tokens, "
          f"{args.heads}/{args.kv_heads} heads × {args.head_dim}, block {args.block}, "
          f"{args.threads} threads, {args.layers} layer copies, {args.runs} rounds × "
          f"{args.calls} calls (median, {'CPU' if args.cpu_time else 'wall'} time); "
          f"AVX-512 BF16 path: {decode.bf16_path()}; "
          f"K+V {kv_bytes / 1e6:.2f} MB per call; max |best − portable| {err:.2g}; "
          f"load {load0} → {load1}")
    print("| batch | best µs | portable µs | read µs | best / portable | best / read |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.batch} | {med['best']:.1f} | {med['portable']:.1f} | {med['read']:.1f} | "
          f"{med['best'] / med['portable']:.2f} | {med['best'] / med['read']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
