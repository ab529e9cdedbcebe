"""``kvstore demo`` (what ``make run`` runs until the engine lands).

An agent-style conversation against the embedded store: every turn re-sends the whole
history (system prompt, tool outputs, replies) plus a few new lines, exactly the shape
that makes ~96 % of input tokens cache hits in production. Each turn looks up its
chain, reads the hit prefix, and commits the blocks it had to compute; the table shows
where the hits came from and the cumulative token hit rate. A second session sharing
the system prompt shows cross-session reuse.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from kvstore.embedded import open_embedded
from kvstore.errors import InvalidArgument
from kvstore.host import memory_size
from kvstore.keys import Namespace, chain_keys
from kvstore.units import format_bytes, parse_duration, parse_size

DEMO_NS = Namespace(
    model_id="demo-agent-1b",
    model_revision="v1",
    kv_dtype="bfloat16",
    kv_layout="mha",
    cached_layers=(0, 1),
    kv_heads=2,
    head_dim=64,
    block_tokens=64,
)


@dataclass(frozen=True, slots=True)
class TurnReport:
    session: int
    turn: int
    prompt_tokens: int
    hit_tokens: dict[str, int]
    computed_tokens: int
    cumulative_hit_rate: float


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=12, help="turns per session (default 12)")
    p.add_argument("--sessions", type=int, default=2, help="sessions sharing a system prompt")
    p.add_argument("--dram", default="8MiB", help="DRAM tier size (small, so the SSD tier shows)")
    p.add_argument("--ssd-dir", help="SSD tier directory (default: a temporary directory)")
    p.add_argument("--ssd-capacity", default="1GiB", help="SSD tier size")
    p.add_argument("--no-ssd", action="store_true", help="DRAM only")
    p.add_argument("--retention", default="72h", help="SSD retention")
    p.add_argument("--seed", type=int, default=0)


def payload(key: bytes, nbytes: int) -> bytes:
    """Stand-in KV for a block: derived from its key, so reads can be checked."""
    return (
        np.random.default_rng(int.from_bytes(key[:8], "little"))
        .integers(0, 256, nbytes, dtype=np.uint8)
        .tobytes()
    )


def _store(args: argparse.Namespace, tmp: str | None):
    ssd_dir = None if args.no_ssd else (args.ssd_dir or tmp)
    try:
        return open_embedded(
            dram_bytes=memory_size("--dram", args.dram),
            ssd_dir=ssd_dir,
            ssd_capacity_bytes=parse_size(args.ssd_capacity),
            retention_s=parse_duration(args.retention),
        )
    except ImportError:
        print("note: SSD engine not available, running DRAM only", file=sys.stderr)
        return open_embedded(dram_bytes=memory_size("--dram", args.dram))


def run_conversation(store, turns: int, sessions: int, seed: int) -> list[TurnReport]:
    ns = DEMO_NS
    store.register(ns)
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 32_000, 4_000).tolist()
    histories = [list(system) for _ in range(sessions)]
    reports: list[TurnReport] = []
    total_in = total_hit = 0
    for turn in range(1, turns + 1):
        for s, history in enumerate(histories):
            # New user lines + a tool output this turn; the reply goes in after.
            history.extend(rng.integers(0, 32_000, int(rng.integers(200, 1_500))).tolist())
            keys = chain_keys(ns, history)
            look = store.lookup(ns, keys)
            dst = bytearray(look.hit_blocks * ns.block_bytes)
            got = store.get_into(ns, keys[: look.hit_blocks], dst)
            for i in range(got):  # the store must hand back exactly what was committed
                if dst[i * ns.block_bytes : (i + 1) * ns.block_bytes] != payload(
                    keys[i], ns.block_bytes
                ):
                    raise RuntimeError(f"wrong bytes for block {i} of session {s}")
            store.commit(
                ns, keys, {i: payload(keys[i], ns.block_bytes) for i in range(got, len(keys))}
            )
            hits: dict[str, int] = {"dram": 0, "ssd": 0}
            for tier in look.tiers[:got]:
                hits[tier] = hits.get(tier, 0) + ns.block_tokens
            hit = got * ns.block_tokens
            total_in += len(history)
            total_hit += hit
            reports.append(
                TurnReport(s, turn, len(history), hits, len(history) - hit, total_hit / total_in)
            )
            history.extend(rng.integers(0, 32_000, int(rng.integers(100, 600))).tolist())  # reply
    return reports


def run(args: argparse.Namespace) -> int:
    for flag, value, most in (
        ("--turns", args.turns, 10_000),
        ("--sessions", args.sessions, 1_000),
    ):
        if not 1 <= value <= most:
            raise InvalidArgument(f"{flag} must be in [1, {most}], got {value}")
    tmp = tempfile.mkdtemp(prefix="kvstore-demo-") if not (args.ssd_dir or args.no_ssd) else None
    try:
        store = _store(args, tmp)
        with store:
            reports = run_conversation(store, args.turns, args.sessions, args.seed)
            stats = store.stats()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(
            json.dumps({"turns": [r.__dict__ for r in reports], "stats": stats.to_dict()}, indent=2)
        )
        return 0
    tiers = [t.name for t in stats.tiers]
    sizes = ", ".join(f"{t.name} {format_bytes(t.capacity_bytes)}" for t in stats.tiers)
    print(
        f"namespace {DEMO_NS.model_id}: {format_bytes(DEMO_NS.block_bytes)}"
        f" per {DEMO_NS.block_tokens}-token block; tiers: {sizes}"
    )
    header = f"{'sess':>4} {'turn':>4} {'prompt':>8} " + " ".join(f"{'hit_' + t:>9}" for t in tiers)
    print(header + f" {'computed':>9} {'cum. hit rate':>14}")
    for r in reports:
        cols = " ".join(f"{r.hit_tokens.get(t, 0):>9}" for t in tiers)
        print(
            f"{r.session:>4} {r.turn:>4} {r.prompt_tokens:>8} {cols} {r.computed_tokens:>9}"
            f" {r.cumulative_hit_rate:>13.2%}"
        )
    print(f"final token hit rate: {reports[-1].cumulative_hit_rate:.2%}" if reports else "no turns")
    return 0
