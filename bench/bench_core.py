"""Core-store benchmarks (issue "Core store", item 7; issue 14, item 3).

1. DRAM tier ``get_into`` / ``put`` of 16-block batches at 64 KiB, 256 KiB and 2 MiB,
   as a ratio to ``torch.Tensor.copy_`` of the same bytes into the same warm buffer,
   with every read checked against its stored xxh3-64 (DESIGN §4):
   a. in cache: one 16-block batch read over and over;
   b. out of cache: a working set of ``--working-set`` (default 1 GiB, far above the
      last-level cache) read batch after batch, against ``copy_`` of the same pool rows
      (same addresses, same order) into the same warm destination; also the row copier
      alone on the same rows (what the tier adds is the rest).
2. Key hashing, ns/token for a 128 K-token prompt given as list, numpy array and torch
   tensor, against vLLM's prefix-hash chain (sha256 of a pickled tuple per block) and
   against the bare cost of converting the list to an array.

Run: ``.venv/bin/python -m bench.bench_core`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import statistics

import numpy as np
import torch

from bench.harness import machine, median_interleaved, timed
from kvstore.dram import DramConfig, DramTier
from kvstore.keys import Namespace, chain_keys
from kvstore.row_copy import RowCopier, make_row_copier
from kvstore.units import parse_size

BATCH = 16


def ns_for_block_bytes(block_bytes: int) -> Namespace:
    # bfloat16, 64 tokens, 2 (K,V) x heads x 128 dims: pick layers to hit the size.
    per_layer = 2 * 64 * 8 * 128 * 2  # 256 KiB with 8 heads
    if block_bytes < per_layer:
        heads = block_bytes // (2 * 64 * 128 * 2)
        return Namespace("bench", "r", "bfloat16", "mha", (0,), heads, 128)
    return Namespace(
        "bench", "r", "bfloat16", "mha", tuple(range(block_bytes // per_layer)), 8, 128
    )


def bench_dram(block_bytes: int, runs: int) -> dict[str, float]:
    ns = ns_for_block_bytes(block_bytes)
    assert ns.block_bytes == block_bytes
    tier = DramTier(DramConfig(capacity_bytes=64 * block_bytes, chunk_bytes=16 * block_bytes))
    tier.register(ns)
    rng = np.random.default_rng(0)
    keys = chain_keys(ns, rng.integers(0, 1 << 20, BATCH * ns.block_tokens))
    src = torch.from_numpy(rng.integers(0, 256, BATCH * block_bytes, dtype=np.uint8))
    dst = torch.empty_like(src)
    tier.put(ns, keys, src)
    warm = torch.empty_like(src)
    repeat = max(3, (256 << 20) // (BATCH * block_bytes))

    def put_rate() -> float:
        # Re-inserting present keys would only touch: delete first so every put copies.
        def one() -> None:
            tier.delete_namespace(ns)
            tier.put(ns, keys, src)

        return BATCH * block_bytes / timed(one, repeat)

    cases = {
        "copy_": lambda: BATCH * block_bytes / timed(lambda: warm.copy_(src), repeat),
        "get_into": lambda: (
            BATCH * block_bytes / timed(lambda: tier.get_into(ns, keys, dst), repeat)
        ),
        "put": put_rate,
    }
    med = median_interleaved(cases, runs)
    assert bytes(dst.numpy()) == bytes(src.numpy())
    return {
        "block_bytes": block_bytes,
        "copy_GBps": med["copy_"] / 1e9,
        "get_GBps": med["get_into"] / 1e9,
        "put_GBps": med["put"] / 1e9,
        "get_vs_copy": med["get_into"] / med["copy_"],
        "put_vs_copy": med["put"] / med["copy_"],
    }


def bench_dram_out_of_cache(
    block_bytes: int, working_set_bytes: int, runs: int
) -> dict[str, float]:
    """Reads that miss every cache: each batch's source rows were last touched a whole
    working set ago. The peer is the bare copy of exactly those pool rows."""
    ns = ns_for_block_bytes(block_bytes)
    batch_bytes = BATCH * block_bytes
    n_batches = max(2, working_set_bytes // batch_bytes)
    chunk = max(batch_bytes, min(64 << 20, working_set_bytes // 8) // batch_bytes * batch_bytes)
    capacity = -(-n_batches * batch_bytes // chunk) * chunk
    tier = DramTier(DramConfig(capacity_bytes=capacity, chunk_bytes=chunk))
    tier._pool.tensor.numpy()[::4096] = 0  # fault every page in before anything is timed
    tier.register(ns)
    rng = np.random.default_rng(1)
    row = torch.from_numpy(rng.integers(0, 256, batch_bytes, dtype=np.uint8))
    chains = []
    for b in range(n_batches):
        keys = chain_keys(ns, rng.integers(0, 1 << 30, BATCH * ns.block_tokens))
        row[:8] = torch.tensor(list(b.to_bytes(8, "little")), dtype=torch.uint8)  # distinct
        tier.put(ns, keys, row)
        chains.append(keys)
    # Each chain landed in adjacent slots of one chunk (in reverse: a put inserts
    # last→first): its rows are one pool range, which the peer copies.
    cs = tier._classes[block_bytes]
    offsets = []
    for keys in chains:
        slots = sorted(cs.slot[k] for k in keys)
        assert slots == list(range(slots[0], slots[0] + BATCH)), "chain not contiguous"
        offsets.append(tier._pool.offset(cs.sc, slots[0]))
    pool = tier._pool.tensor
    dst = torch.empty(batch_bytes, dtype=torch.uint8)
    total = n_batches * batch_bytes

    shared, serial = tier._copier, make_row_copier(1)

    def get_rate(copier: RowCopier) -> float:
        def one() -> None:
            for keys in chains:
                if tier.get_into(ns, keys, dst) != BATCH:
                    raise AssertionError("a block failed its check")

        tier._copier = copier
        try:
            return total / timed(one)
        finally:
            tier._copier = shared

    def copy_rate() -> float:
        def one() -> None:
            for off in offsets:
                dst.copy_(pool[off : off + batch_bytes])

        return total / timed(one)

    src_mv, dst_mv = pool.numpy().data, dst.numpy().data

    def memcpy_rate() -> float:  # one core, one memcpy per batch
        def one() -> None:
            for off in offsets:
                dst_mv[:] = src_mv[off : off + batch_bytes]

        return total / timed(one)

    row_offsets = [[tier._pool.offset(cs.sc, cs.slot[k]) for k in keys] for keys in chains]
    row_sums = [[cs.csum[k] for k in keys] for keys in chains]
    pool_mv = tier._pool.view

    def copier_rate() -> float:  # the same copy and check without the tier around it
        def one() -> None:
            for offs, sums in zip(row_offsets, row_sums, strict=True):
                if shared.copy_verified(pool_mv, offs, dst_mv, block_bytes, sums) != BATCH:
                    raise AssertionError("a block failed its check")

        return total / timed(one)

    cases = {
        "copy_": copy_rate,
        "memcpy": memcpy_rate,
        "get_into": lambda: get_rate(shared),
        "get_into_1thread": lambda: get_rate(serial),
        "copier": copier_rate,
    }
    for fn in cases.values():  # warm-up: page tables, allocator, thread pool
        fn()
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(max(5, runs)):  # interleaved rounds; ratios taken within a round
        for name, fn in cases.items():
            rounds[name].append(fn())
    tier.close()
    out: dict[str, float] = {"block_bytes": block_bytes, "working_set_bytes": total}
    for name, rates in rounds.items():
        out[f"{name}_GBps"] = statistics.median(rates) / 1e9
    for name in ("get_into", "get_into_1thread", "copier"):
        for peer in ("copy_", "memcpy"):
            ratios = [g / p for g, p in zip(rounds[name], rounds[peer], strict=True)]
            key = f"{name}_vs_{peer}"
            out[key] = statistics.median(ratios)
            out[key + "_min"], out[key + "_max"] = min(ratios), max(ratios)
    return out


def vllm_chain(tokens: list[int], block: int) -> list[bytes]:
    """vLLM's prefix hash (sha256 over a pickled (parent, block tokens, extra) tuple)."""
    parent: bytes | None = None
    out = []
    for i in range(0, len(tokens) - block + 1, block):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i : i + block]), None))).digest()
        out.append(parent)
    return out


def bench_hashing(runs: int, n_tokens: int = 128 * 1024) -> dict[str, float]:
    ns = Namespace("bench", "r", "bfloat16", "mha", (0,), 8, 128)
    arr = np.random.default_rng(1).integers(0, 128_000, n_tokens, dtype=np.int64)
    lst, ten = arr.tolist(), torch.from_numpy(arr)
    cases = {
        "array": lambda: timed(lambda: chain_keys(ns, arr), 5),
        "tensor": lambda: timed(lambda: chain_keys(ns, ten), 5),
        "list": lambda: timed(lambda: chain_keys(ns, lst), 5),
        "list_to_array": lambda: timed(lambda: np.asarray(lst), 5),
        "vllm_sha256": lambda: timed(lambda: vllm_chain(lst, ns.block_tokens), 1),
    }
    med = median_interleaved(cases, runs)
    ns_per = {k: v / n_tokens * 1e9 for k, v in med.items()}
    return {
        **{f"{k}_ns_per_token": v for k, v in ns_per.items()},
        "vllm_over_array": ns_per["vllm_sha256"] / ns_per["array"],
        "list_over_conversion": ns_per["list"] / ns_per["list_to_array"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--working-set", type=parse_size, default=1 << 30, help="out-of-cache working set"
    )
    ap.add_argument(
        "--sizes", help="comma-separated block sizes (default 64KiB,256KiB,2MiB; --quick: 2)"
    )
    args = ap.parse_args()
    sizes = [64 << 10, 256 << 10] if args.quick else [64 << 10, 256 << 10, 2 << 20]
    if args.sizes:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    runs = 3 if args.quick else args.runs
    ws = min(args.working_set, 128 << 20) if args.quick else args.working_set
    print(f"# machine: {machine()}; row copier: {type(make_row_copier()).__name__}")
    dram = [bench_dram(s, runs) for s in sizes]
    print("In cache (one 16-block batch):\n")
    print("| block | copy_ GB/s | get_into GB/s | put GB/s | get/copy_ | put/copy_ |")
    print("|---|---|---|---|---|---|")
    for r in dram:
        print(
            f"| {int(r['block_bytes']) >> 10} KiB | {r['copy_GBps']:.2f} | {r['get_GBps']:.2f}"
            f" | {r['put_GBps']:.2f} | {r['get_vs_copy']:.2f} | {r['put_vs_copy']:.2f} |"
        )
    cold = [bench_dram_out_of_cache(s, ws, runs) for s in sizes]
    print(
        f"\nOut of cache ({ws >> 20} MiB working set;"
        " ratios: median of per-round ratios [range]):\n"
    )
    print(
        "| block | copy_ GB/s | memcpy GB/s | get_into GB/s | get/copy_ | get/memcpy"
        " | 1 thread GB/s | 1 thread/copy_ | 1 thread/memcpy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def ratio(r: dict[str, float], key: str) -> str:
        return f"{r[key]:.2f} [{r[key + '_min']:.2f}–{r[key + '_max']:.2f}]"

    for r in cold:
        print(
            f"| {int(r['block_bytes']) >> 10} KiB | {r['copy__GBps']:.2f} | {r['memcpy_GBps']:.2f}"
            f" | {r['get_into_GBps']:.2f} | {ratio(r, 'get_into_vs_copy_')}"
            f" | {ratio(r, 'get_into_vs_memcpy')} | {r['get_into_1thread_GBps']:.2f}"
            f" | {ratio(r, 'get_into_1thread_vs_copy_')}"
            f" | {ratio(r, 'get_into_1thread_vs_memcpy')} |"
        )
    for r in cold:
        print(
            f"\n{int(r['block_bytes']) >> 10} KiB, the row copier alone on the same rows (no tier"
            f" around it): {r['copier_GBps']:.2f} GB/s, / copy_ {ratio(r, 'copier_vs_copy_')},"
            f" / memcpy {ratio(r, 'copier_vs_memcpy')}"
        )
    h = bench_hashing(runs)
    print()
    print("| input | ns/token |")
    print("|---|---|")
    for k in ("array", "tensor", "list", "list_to_array", "vllm_sha256"):
        print(f"| {k} | {h[k + '_ns_per_token']:.2f} |")
    print(
        f"\nvLLM sha256 chain / ours (array): {h['vllm_over_array']:.1f}x;"
        f" list input / list->array conversion: {h['list_over_conversion']:.2f}x"
    )
    print(json.dumps({"dram": dram, "dram_out_of_cache": cold, "hashing": h}))


if __name__ == "__main__":
    main()
