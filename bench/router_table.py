"""The prediction and the table of ``bench/bench_router.py``: the replica simulator on the
requests a run sent (``fleet_prediction``), one row per configuration, medians over rounds."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Container, Hashable, Sequence
from pathlib import Path
from typing import Any

from bench.harness import machine
from engine.server.bench_serve import TIERS
from engine.server.scaled_requests import ScaledRequest
from kvstore.hitrate.config import ABSENT, SimConfig
from kvstore.hitrate.replicas import FleetConfig, ReplicaSimulator
from kvstore.hitrate.request import Request
from kvstore.hitrate.routing import Router, make_router
from kvstore.units import Capacity

MODELS = ("instant", "timed", "taken")


class Served(Router):
    """Routes the ``n``-th request to ``replicas[n]``: where a measured run served it."""

    name = "served"

    def __init__(self, replicas: list[int]) -> None:
        super().__init__(2)
        self._replicas = iter(replicas)

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        return max(0, next(self._replicas))


def fleet_prediction(sessions: list[list[ScaledRequest]],
                     timed: list[tuple[int, int, float, float]], k: int, pool_tokens: int,
                     dram_blocks: int, routing: str, model: str = "instant",
                     served: list[int] | None = None) -> dict[str, Any]:
    """What the replica simulator (``kvstore hitrate --replicas 2 --routing ROUTING``'s
    ``ReplicaSimulator``) says for these requests, ``timed`` = (session, turn, sent_s,
    done_s) in the order sent, under one of ``MODELS``: ``instant``, each looked up and
    committed at once in the order sent (a trace's model, as ``feed``); ``timed``, looked
    up when sent and committed when its answer ended (``feed_timed``); ``taken``, as
    ``timed`` but its replica's pool also takes (evicts for) its blocks when it is sent
    (``feed_timed(take_at_arrival=True)``). ``served``: the replica that served each
    request (its reply's ``kvengine.pid``), routed there instead of by ``routing`` (the
    pool model alone, against the engine's). Totals, and each request's replica and hit
    tokens per tier."""
    config = SimConfig(hbm=Capacity(tokens=pool_tokens // k * k),
                       dram=ABSENT if dram_blocks <= 0 else Capacity(tokens=dram_blocks * k),
                       ssd=ABSENT, replay_keep_tokens=0)
    router = make_router(routing, 2) if served is None else Served(served)
    sim = ReplicaSimulator(config, FleetConfig(2), router)
    reqs = []
    for n, (s, i, sent, done) in enumerate(timed):
        r = sessions[s][i]
        at = (float(n), float(n)) if model == "instant" else (sent, done)
        reqs.append((Request(at[0], len(r.keys) * k + r.tail_tokens, r.keys, k), at[1]))
    per: list[dict[str, int]] = [{} for _ in reqs]
    last = [0, 0, 0]

    def looked_up(n: int, replica: int) -> None:
        nonlocal last
        now = list(sim.tally.tier_hit_tokens)
        per[n] = dict(zip(TIERS, (a - b for a, b in zip(now, last, strict=True)), strict=True))
        last = now

    replicas = sim.feed_timed(reqs, looked_up, take_at_arrival=model == "taken")
    result = sim.result()
    prompt = sum(len(sessions[s][i].prompt) for s, i, _, _ in timed)
    hits = {t: result.tier(t).hit_tokens for t in TIERS}
    return {"token_hit_rate": result.token_hit_rate,
            "requests_per_replica": list(sim.router.loads),
            "hit_tokens": hits, "prompt_tokens": prompt,
            "hit_rate_by_tier": {t: hits[t] / prompt for t in TIERS},
            "per_request": [{"replica": r, "hit_tokens": h}
                            for r, h in zip(replicas, per, strict=True)]}


def row(r: dict[str, Any]) -> str:
    m, p = r["hit_rate_by_tier"], r["predicted"]["hit_rate_by_tier"]
    q = r.get("predicted_served", {}).get("hit_rate_by_tier")
    served = f"{q['hbm']:.3f} / {q['dram']:.3f}" if q else "-"
    delta = 100 * (r["token_hit_rate"] - r["predicted"]["token_hit_rate"])
    return (f"| {r['label']} | {r['token_hit_rate']:.3f} ({m['hbm']:.3f} / {m['dram']:.3f}) | "
            f"{r['predicted']['token_hit_rate']:.3f} ({p['hbm']:.3f} / {p['dram']:.3f}) | "
            f"{delta:+.1f} | {served} | {r['ttft_s']['p50'] * 1e3:.0f} ms | "
            f"{r['ttft_s']['p90'] * 1e3:.0f} ms | {r['errors']} | "
            f"{' / '.join('-' if n is None else str(n) for n in r['requests_per_replica'])} "
            f"({' / '.join(str(n) for n in r['predicted']['requests_per_replica'])}) |")


def median_run(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the rounds ``rs``: every hit rate (measured and predicted, in total and by
    tier) and TTFT quantile the median over the rounds; the rest the last round's."""
    med = dict(rs[-1])

    def mid(get: Any) -> float:
        return statistics.median(get(r) for r in rs)

    med["token_hit_rate"] = mid(lambda r: r["token_hit_rate"])
    med["hit_rate_by_tier"] = {t: mid(lambda r, t=t: r["hit_rate_by_tier"][t]) for t in TIERS}
    med["predicted"] = dict(rs[-1]["predicted"])
    med["predicted"]["token_hit_rate"] = mid(lambda r: r["predicted"]["token_hit_rate"])
    med["predicted"]["hit_rate_by_tier"] = {
        t: mid(lambda r, t=t: r["predicted"]["hit_rate_by_tier"][t]) for t in TIERS}
    med["ttft_s"] = {q: mid(lambda r, q=q: r["ttft_s"][q]) for q in ("p50", "p90")}
    return med


def print_table(runs: dict[str, list[dict[str, Any]]], kills: list[dict[str, Any]],
                a: argparse.Namespace) -> None:
    print(f"\n{machine()}; {a.sessions} sessions x {a.requests_per_session} turns, k={a.k}, "
          f"pool {a.pool_tokens} tokens per replica, {a.rounds} round(s), medians of TTFT")
    print("| routing | measured hit (hbm / dram) | predicted (hbm / dram) | Δ points | "
          "predicted where served (hbm / dram) | TTFT p50 | p90 | errors | "
          "requests per replica (predicted) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rs in runs.values():
        print(row(median_run(rs)))
        if len(rs) > 1:
            deltas = (100 * (r["token_hit_rate"] - r["predicted"]["token_hit_rate"])
                      for r in rs)
            print("  per round, measured - predicted: "
                  + ", ".join(f"{d:+.1f}" for d in deltas) + " points")
    for k in kills:
        ref = runs["round_robin"][kills.index(k)]["texts"]
        wrong = sum(1 for key, text in k["texts"].items() if ref.get(key) != text)
        hit = k["after_kill"]["hit_rate_by_tier"]
        print(f"kill: {k['requests']} answered, {k['errors']} failed, {wrong} answers differ "
              f"from the run without the kill; after the kill: hbm {hit['hbm']:.3f}, store "
              f"(dram) {hit['dram']:.3f} of prompt tokens")


def repredict(path: str, sessions: list[list[ScaledRequest]], k: int, pool_tokens: int,
              dram_blocks: int) -> None:
    """Each run a ``--json`` file recorded, against every model's prediction (from the
    requests' recorded send and answer times): hit rate by tier, and the points off."""
    saved = json.loads(Path(path).read_text())
    runs = [r for rs in saved["runs"].values() for r in rs] + saved.get("kills", [])
    cols = [(m, False) for m in MODELS] + [(m, True) for m in MODELS]
    print("| run | measured (hbm / dram) | "
          + " | ".join(f"{m}{' @served' if on else ''}" for m, on in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for r in runs:
        if "timed" not in r:
            continue
        routing = "round_robin" if r["label"].startswith("round_robin") else r["label"]
        store = "pools alone" not in r["label"]
        m = r["hit_rate_by_tier"]
        cells = []
        for model, on in cols:
            served = r.get("served_replicas") if on else None
            if on and served is None:
                cells.append("-")
                continue
            p = fleet_prediction(sessions, [tuple(t) for t in r["timed"]], k, pool_tokens,
                                 r.get("dram_blocks", dram_blocks) if store else 0, routing,
                                 model, served)["hit_rate_by_tier"]
            off = max(abs(m[t] - p[t]) for t in ("hbm", "dram")) * 100
            cells.append(f"{p['hbm']:.3f} / {p['dram']:.3f} ({off:.1f})")
        print(f"| {r['label']} | {m['hbm']:.3f} / {m['dram']:.3f} | " + " | ".join(cells) + " |")
