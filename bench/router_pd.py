"""``bench/bench_router.py --pd``: co-located against prefill/decode disaggregation through
the store, behind the real vllm-router, on bench_router's slice and shared daemon (issue 32,
item 6). Co-located: two ``--kv-role both`` replicas behind ``round_robin``; PD: a ``--kv-role
prefill`` and a ``--kv-role decode`` replica behind ``--vllm-pd-disaggregation``. Per turn,
TTFT and time per output token (the stream's time after its first chunk over the tokens
after the first); each run's p50/p90, medians over interleaved rounds, PD over co-located;
and how many of PD's answers are the co-located run's (greedy: all should be)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_router import Fleet, send_all
from bench.harness import machine
from engine.model.make_model import make_model
from engine.server.bench_serve import Outcome
from engine.server.scaled_requests import load_sessions


def pcts(xs: list[float]) -> dict[str, float]:
    """p50 and p90 (0 for no sample)."""
    if not xs:
        return {"p50": 0.0, "p90": 0.0}
    if len(xs) == 1:
        return {"p50": xs[0], "p90": xs[0]}
    return {"p50": statistics.median(xs),
            "p90": statistics.quantiles(xs, n=10, method="inclusive")[8]}


def tpot_s(o: Outcome, max_tokens: int) -> float | None:
    """Time per output token after the first (None when only one came back)."""
    n = o.completion_tokens or max_tokens
    return (o.total_s - o.ttft_s) / (n - 1) if n > 1 else None


def pd_one(model: Path, a: argparse.Namespace, work: Path, pd: bool) -> dict[str, Any]:
    fleet = Fleet(model, a, work, "round_robin", True, pd=pd)
    try:
        meta = fleet.info["kvengine"]
        sessions = load_sessions(a.paths, a.k, meta["vocab_size"], 16, None,
                                 a.requests_per_session)
        rep = send_all(fleet, sessions, a.concurrency or len(sessions), a.pd_max_tokens, None,
                       a.think_s)
    finally:
        fleet.close()
    tpots = [t for o in rep.outcomes if (t := tpot_s(o, a.pd_max_tokens)) is not None]
    return {"label": "PD (prefill + decode)" if pd else "co-located (2 x both)",
            "ttft_s": pcts([o.ttft_s for o in rep.outcomes]), "tpot_s": pcts(tpots),
            "requests": len(rep.outcomes), "errors": len(rep.errors),
            "first_errors": rep.errors[:3],
            "texts": {f"{o.session}/{o.index}": o.text for o in rep.outcomes}}


def pd_main(a: argparse.Namespace) -> None:
    """Co-located vs PD, rounds interleaved; medians over rounds of each run's p50/p90."""
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = (Path(a.model) if a.model
                 else make_model("qwen3", a.preset, work / f"{a.preset}-qwen3").path)
        for _ in range(a.rounds):
            for pd in (False, True):
                runs[pd].append(pd_one(model, a, work, pd))
                r = runs[pd][-1]
                print(f"{r['label']}: TTFT p50 {r['ttft_s']['p50'] * 1e3:.0f} ms, TPOT p50 "
                      f"{r['tpot_s']['p50'] * 1e3:.1f} ms, {r['errors']} errors", flush=True)

    def med(pd: bool, what: str, q: str) -> float:
        return statistics.median(r[what][q] for r in runs[pd])

    print(f"\n{machine()}; {a.sessions} sessions x {a.requests_per_session} turns, k={a.k}, "
          f"{a.pd_max_tokens} tokens a turn, pool {a.pool_tokens} tokens per replica, "
          f"{a.rounds} round(s), medians over rounds")
    print("| setup | TTFT p50 | p90 | TPOT p50 | p90 | errors | answers = co-located |")
    print("|---|---|---|---|---|---|---|")
    for pd in (False, True):
        cells = []
        for what, scale, fmt in (("ttft_s", 1e3, ".0f"), ("tpot_s", 1e3, ".1f")):
            for q in ("p50", "p90"):
                v, ref = med(pd, what, q), med(False, what, q)
                cells.append(f"{v * scale:{fmt}} ms" + (f" ({v / ref:.2f}x)" if pd and ref
                                                       else ""))
        same = sum(sum(1 for key, text in r["texts"].items() if base.get(key) == text)
                   for r, base in zip(runs[pd], (c["texts"] for c in runs[False]),
                                      strict=True))
        total = sum(r["requests"] for r in runs[pd])
        print(f"| {runs[pd][0]['label']} | {' | '.join(cells)} | "
              f"{sum(r['errors'] for r in runs[pd])} | {same}/{total} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"pd": runs[True], "co_located": runs[False]},
                                           indent=1))

