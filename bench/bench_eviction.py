"""Insert cost of the eviction policies against the number of resident blocks (issue 14,
item 8): the cost of one insert into a full cache must not grow with the cache.

1. Policy: what the DRAM tier does per insert once full — ``peek_victim`` (choose the
   size class to take from), ``pop_victim``, ``access(new key)`` — plus one touch of a
   recently inserted key per insert (re-used keys make S3-FIFO promote and rotate).
2. DRAM tier: ``put`` of 16-block chains of 64-byte blocks into a full tier.

Each at 10^3 and 10^6 resident blocks, built once; every round times new inserts into the
full cache. The figure is ns per inserted block and the ratio of the two sizes (1.0 =
flat). Run: ``.venv/bin/python -m bench.bench_eviction``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable

import numpy as np

from bench.harness import machine, median_interleaved, timed
from kvstore.dram import DramConfig, DramTier
from kvstore.eviction import POLICIES, make_policy
from kvstore.keys import Namespace, chain_keys

SIZES = (1_000, 1_000_000)
CHAIN = 16
TINY = Namespace("bench", "r", "float16", "mha", (0,), 1, 1, block_tokens=16)  # 64 B


def policy_rounds(name: str, resident: int, inserts: int) -> Callable[[], float]:
    p = make_policy(name, resident)
    for k in range(resident):
        p.access(k)
    rng = random.Random(0)
    state = {"next": resident}

    def round_ns() -> float:
        def run() -> None:
            k = state["next"]
            for _ in range(inserts):
                p.peek_victim()
                p.pop_victim()
                p.access(k)
                p.touch(k - rng.randrange(1, resident // 2 + 2))
                k += 1
            state["next"] = k

        return timed(run) / inserts * 1e9

    return round_ns


def tier_rounds(name: str, resident: int, inserts: int) -> Callable[[], float]:
    bb = TINY.block_bytes
    cap = resident * bb
    t = DramTier(DramConfig(capacity_bytes=cap, chunk_bytes=max(bb, cap // 8), policy=name))
    t.register(TINY)
    rng = np.random.default_rng(0)
    payload = bytes(CHAIN * bb)

    def chain() -> list[bytes]:
        return chain_keys(TINY, rng.integers(0, 1 << 30, CHAIN * TINY.block_tokens))

    for _ in range(resident // CHAIN + 1):
        t.put(TINY, chain(), payload)
    n_chains = max(1, inserts // CHAIN)

    def round_ns() -> float:
        chains = [chain() for _ in range(n_chains)]

        def run() -> None:
            for keys in chains:
                t.put(TINY, keys, payload)

        return timed(run) / (n_chains * CHAIN) * 1e9

    return round_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--inserts", type=int, default=20_000, help="inserts timed per round")
    args = ap.parse_args()
    print(f"# machine: {machine()}")
    rows = []
    for name in sorted(POLICIES):
        for what, make in (("policy", policy_rounds), ("dram tier", tier_rounds)):
            cases = {str(n): make(name, n, args.inserts) for n in SIZES}
            med = median_interleaved(cases, args.runs)
            small, big = med[str(SIZES[0])], med[str(SIZES[1])]
            rows.append(
                {"policy": name, "into": what, "ns_1e3": small, "ns_1e6": big, "ratio": big / small}
            )
    print("| policy | insert into | ns/insert, 10^3 resident | ns/insert, 10^6 | 10^6 / 10^3 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['into']} | {r['ns_1e3']:.0f} | {r['ns_1e6']:.0f}"
            f" | {r['ratio']:.2f} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
