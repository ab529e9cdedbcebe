"""A hit's multiply-adds, counted from a model's ``config.json``: what bounded replay's row
cut (``engine.core.row_cut``) should save, to set beside ``bench/bench_replay.py --ab-cut``.

Per token and layer: the projections and the MLP (``q, k, v``, ``o``, gate/up/down), plus
``2 · heads · head_dim`` per key attended (scores and values): up to the window in a
sliding layer, the whole prefix in a full one. The logits row and the norms are left out.
The cases, for ``C`` cached and ``N`` new tokens: the exact hit computes the ``N`` new
tokens; a bounded hit adds ``keep`` replayed tokens, through every layer (``nocut``) or,
with the cut, through the layers below the last sliding one plus that layer's fused
``qkv`` projection (its ``q`` rows are computed and dropped: one matmul); cold computes
all ``C + N``. Not a measurement: a CPU prefill costs about its multiply-adds when the
matmuls dominate, so the ratios are a prediction the TTFT ratios are read against::

    python -m bench.replay_macs --model ~/.cache/kvengine/models/gemma3-270m \\
        --sizes 7168,15360,31744 --keeps 524,140
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    windows: tuple[int | None, ...]

    @staticmethod
    def from_config(cfg: dict) -> Shape:  # type: ignore[type-arg]
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or ["full_attention"] * n
        window = cfg.get("sliding_window")
        heads = cfg["num_attention_heads"]
        return Shape(cfg["hidden_size"], cfg["intermediate_size"], heads,
                     cfg.get("num_key_value_heads", heads),
                     cfg.get("head_dim") or cfg["hidden_size"] // heads,
                     tuple(window if t == "sliding_attention" else None for t in types))

    @property
    def qkv(self) -> int:
        return self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def dense(self) -> int:
        o_proj = self.heads * self.head_dim * self.hidden
        return self.qkv + o_proj + 3 * self.hidden * self.intermediate

    def token(self, pos: int, layers: Sequence[int]) -> int:
        keys = [pos + 1 if self.windows[i] is None else min(pos + 1, self.windows[i] or 0)
                for i in layers]
        return sum(self.dense + 2 * self.heads * self.head_dim * k for k in keys)


@dataclass(frozen=True, slots=True)
class HitCount:
    exact: int
    bounded_nocut: int
    bounded_cut: int
    cold: int


def count(shape: Shape, cached: int, new: int, keep: int) -> HitCount:
    every = range(len(shape.windows))
    below = range(max(i for i, w in enumerate(shape.windows) if w is not None))
    exact = sum(shape.token(p, every) for p in range(cached, cached + new))
    replay = range(max(0, cached - keep), cached)
    nocut = sum(shape.token(p, every) for p in replay)
    cut = sum(shape.token(p, below) + shape.qkv for p in replay)
    cold = sum(shape.token(p, every) for p in range(cached + new))
    return HitCount(exact, exact + nocut, exact + cut, cold)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="replay_macs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint directory")
    p.add_argument("--sizes", default="7168,15360,31744", help="cached tokens, comma-separated")
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--keeps", default="524,140", help="replayed tokens, comma-separated")
    args = p.parse_args(argv)
    try:
        shape = Shape.from_config(json.loads((args.model / "config.json").read_text()))
        sizes = [int(s) for s in args.sizes.split(",")]
        keeps = [int(k) for k in args.keeps.split(",")]
    except (OSError, ValueError, KeyError) as e:
        p.error(f"{args.model}: {e}")
    if all(w is None for w in shape.windows):
        p.error("the model has no sliding layers: nothing is replayed")
    print("| cached | keep | bounded / exact, uncut → cut | cut / uncut | "
          "cold / bounded, uncut → cut |\n|---|---|---|---|---|")
    for c in sizes:
        for k in keeps:
            h = count(shape, c, args.new_tokens, k)
            print(f"| {c} | {k} | {h.bounded_nocut / h.exact:.3f} → "
                  f"{h.bounded_cut / h.exact:.3f} | {h.bounded_cut / h.bounded_nocut:.3f} | "
                  f"{h.cold / h.bounded_nocut:.1f} → {h.cold / h.bounded_cut:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
