"""``kvengine bench-serve``: replay agent traces (kv-cache-tester sessions or Mooncake
JSONL) through a running ``kvengine serve``, scaled and structure-preserving, and compare its
hit rate with the simulator's (``kvstore hitrate``) on the same requests.

Each trace block becomes ``k`` tokens (``--tokens-per-trace-block``; start the server with
``--block-tokens k``), as ``engine.server.scaled_requests`` scales them. Prompts go as
token-id lists to ``/v1/completions`` with ``max_tokens`` small, streamed, with
``include_usage``; start the server with ``--no-cache-generated`` so the caches hold what
the simulator models.

Arrivals are closed-loop per session: a session's next request is sent when its previous
answer is complete; sessions run concurrently (``--concurrency``). Mooncake has no sessions:
each request is a session of one, so ``--concurrency`` requests are in flight in trace
order. Client TTFT is the time to the first streamed chunk; the server's own split of it
(queue, store lookup, store load, compute) and the hit tokens per tier come back in each
request's last chunk (the ``kvengine`` extension field). The prediction replays the same
scaled requests through the simulator with the server's pool as ``hbm`` and its DRAM and
SSD (``--dram``/``--ssd``, as given to the server) at the server's block size, in the order
the server was sent them (the closed loop reorders sessions against trace time) and in
trace time order.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from engine.errors import EngineInputError
from engine.server.scaled_requests import ScaledRequest, load_sessions, trace_format
from kvstore.hitrate.config import ABSENT, SimConfig
from kvstore.hitrate.request import Request
from kvstore.hitrate.simulator import Simulator
from kvstore.units import Capacity, parse_size

TIERS = ("hbm", "dram", "ssd")
PARTS = ("queue_s", "store_lookup_s", "store_load_s", "compute_s")
MOONCAKE_CONCURRENCY = 8


@dataclass
class Outcome:
    session: int
    index: int  # the request's place in its session
    sent_s: float  # perf_counter() when it was sent (the order the server saw)
    prompt_tokens: int
    cached_tokens: int
    hit_tokens: dict[str, int]
    ttft_s: float  # client side: send to first chunk
    parts: dict[str, float]
    total_s: float
    text: str = ""  # what was generated (a replay through replicas checks it is the same)
    completion_tokens: int = 0  # the usage's (0: the server sent no usage)
    server_pid: int | None = None  # the process that served it (behind a router: which)


@dataclass
class Replay:
    sessions: list[list[ScaledRequest]]
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="kv-cache-tester session files (one JSON document per session) or "
                        "Mooncake JSONL traces (hash_ids); files, directories or globs")
    p.add_argument("--format", default="auto", choices=("auto", "kv-cache-tester", "mooncake"),
                   help="trace format (default: told from the first file)")
    p.add_argument("--target", default="http://127.0.0.1:8000", metavar="URL",
                   help="the kvengine serve to replay through (default: %(default)s)")
    p.add_argument("--tokens-per-trace-block", type=int, required=True, metavar="K",
                   help="tokens per trace block (64 tokens in kv-cache-tester, 512 in "
                        "Mooncake); the server must run with --block-tokens K")
    p.add_argument("--sessions", type=int, default=None, metavar="N",
                   help="replay the first N sessions (kv-cache-tester: files in name order; "
                        "Mooncake: each request is a session of one, so the first N requests)")
    p.add_argument("--requests-per-session", type=int, default=None, metavar="M",
                   help="replay each session's first M requests (time order)")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="sessions in flight at once (default: every kv-cache-tester session; "
                        f"{MOONCAKE_CONCURRENCY} Mooncake requests)")
    p.add_argument("--max-tokens", type=int, default=1, metavar="N",
                   help="tokens generated per request (default: %(default)s)")
    p.add_argument("--model", default=None, help="model name (default: the server's)")
    p.add_argument("--api-key", default=None, help="bearer token, if the server wants one")
    p.add_argument("--vocab-low", type=int, default=16, metavar="ID",
                   help="lowest token id used (keeps clear of special tokens)")
    p.add_argument("--dram", default="0", metavar="SIZE",
                   help="prediction: the server's DRAM tier, as given to it with --dram "
                        "(0: none, as --kv-store none)")
    p.add_argument("--ssd", default="0", metavar="SIZE",
                   help="prediction: the server's SSD tier, as its --ssd-capacity (0: none)")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object (no progress bar): requests, "
                        "errors, wall_s, requests_per_s, prompt_tokens_per_s, ttft_s and "
                        "ttft_parts_s (p50/p90/p99/mean, seconds), prompt/cached/hit tokens, "
                        "token_hit_rate and hit_rate_by_tier as the server counted them, "
                        "predicted (the simulator, in the order served) and "
                        "predicted_trace_order")


# -- the replay ------------------------------------------------------------------------

class Target:
    def __init__(self, url: str, api_key: str | None) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise EngineInputError(f"--target {url!r}: expected http://HOST:PORT")
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get_json(self, path: str) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path, headers=self.headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise EngineInputError(f"GET {path}: HTTP {resp.status}: {body[:200]!r}")
            return json.loads(body)
        except OSError as e:
            raise EngineInputError(f"cannot reach {self.host}:{self.port}: {e}") from None
        finally:
            conn.close()

    def complete(self, conn: http.client.HTTPConnection, model: str, prompt: list[int],
                 max_tokens: int) -> Outcome:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}})
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers=self.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        first: float | None = None
        last: dict[str, Any] = {}
        text: list[str] = []
        done = False
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            if first is None:
                first = time.perf_counter()
            data = line[6:]
            if data == b"[DONE]":
                resp.read()  # the end of the chunked body: the connection is reused
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            text.extend(c.get("text") or "" for c in chunk.get("choices") or ())
            if chunk.get("usage"):
                last = chunk
        if not done:  # cut off (a replica killed mid-stream): an error, never an answer
            raise RuntimeError("the stream ended before its [DONE]")
        end = time.perf_counter()
        usage, ext = last.get("usage") or {}, last.get("kvengine") or {}
        return Outcome(
            session=-1, index=-1, sent_s=start,
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
            hit_tokens={t: int(ext.get("hit_tokens", {}).get(t, 0)) for t in TIERS},
            ttft_s=(first or end) - start,
            parts={p: float(ext.get(p, 0.0)) for p in PARTS},
            total_s=end - start,
            text="".join(text),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            server_pid=ext.get("pid"),
        )


def replay(target: Target, model: str, sessions: list[list[ScaledRequest]], max_tokens: int,
           concurrency: int, progress: bool) -> Replay:
    result = Replay(sessions)
    lock = threading.Lock()
    todo = iter(range(len(sessions)))
    bar = tqdm(total=sum(len(s) for s in sessions), unit="req", desc="replay",
               disable=None if progress else True)

    def worker() -> None:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=600)
        try:
            while True:
                with lock:
                    s = next(todo, None)
                if s is None:
                    return
                for i, req in enumerate(sessions[s]):  # closed loop: next turn after this answer
                    try:
                        out = target.complete(conn, model, req.prompt, max_tokens)
                        out.session, out.index = s, i
                    except (OSError, RuntimeError, http.client.HTTPException) as e:
                        conn.close()
                        conn = http.client.HTTPConnection(target.host, target.port,
                                                          timeout=600)
                        with lock:
                            result.errors.append(f"session {s}: {e}")
                        continue
                    with lock:
                        result.outcomes.append(out)
                        bar.update(1)
        finally:
            conn.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall_s = time.perf_counter() - start
    bar.close()
    return result


# -- the prediction and the report -------------------------------------------------------

def predict(sessions: list[list[ScaledRequest]], k: int, pool_tokens: int, dram_blocks: int,
            ssd_blocks: int, order: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The simulator on the scaled requests: in trace time order (DESIGN §10), or in
    ``order`` ((session, index) pairs: the order the server was sent them)."""
    def cap(blocks: int) -> Capacity:
        return ABSENT if blocks <= 0 else Capacity(tokens=blocks * k)

    sim = Simulator(SimConfig(hbm=cap(pool_tokens // k), dram=cap(dram_blocks),
                              ssd=cap(ssd_blocks), replay_keep_tokens=0))
    if order is None:
        merged = sorted(((r.time_s, r.session, i, r) for s in sessions
                         for i, r in enumerate(s)), key=lambda x: (x[0], x[1], x[2]))
        stream = [r for _, _, _, r in merged]
    else:
        stream = [sessions[s][i] for s, i in order]
    # Times only order the SSD's retention, which no replay here reaches: one clock tick each.
    sim.feed(Request(float(n), len(r.keys) * k + r.tail_tokens, r.keys, k)
             for n, r in enumerate(stream))
    res = sim.result()
    total = res.input_tokens if hasattr(res, "input_tokens") else None
    d = res.to_dict()
    tiers = {name: res.tier(name).hit_tokens for name in TIERS}
    prompt = total if total is not None else sum(len(r.prompt) for s in sessions for r in s)
    return {"token_hit_rate": res.token_hit_rate, "hit_tokens": tiers,
            "prompt_tokens": prompt, "simulator": d}


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def report(rep: Replay, prediction: dict[str, Any],
           served: dict[str, Any] | None = None) -> dict[str, Any]:
    """``prediction``: the simulator in trace order; ``served``: in the order served."""
    outs = rep.outcomes
    prompt = sum(o.prompt_tokens for o in outs)
    hits = {t: sum(o.hit_tokens[t] for o in outs) for t in TIERS}
    cached = sum(o.cached_tokens for o in outs)
    return {
        "requests": len(outs),
        "errors": len(rep.errors),
        "sessions": len(rep.sessions),
        "wall_s": rep.wall_s,
        "requests_per_s": len(outs) / rep.wall_s if rep.wall_s else 0.0,
        "prompt_tokens_per_s": prompt / rep.wall_s if rep.wall_s else 0.0,
        "ttft_s": _pcts([o.ttft_s for o in outs]),
        "ttft_parts_s": {p.removesuffix("_s"): _pcts([o.parts[p] for o in outs])
                         for p in PARTS},
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_tokens": hits,
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_by_tier": {t: hits[t] / prompt if prompt else 0.0 for t in TIERS},
        "predicted": _rates(served or prediction),
        "predicted_trace_order": _rates(prediction),
        "first_errors": rep.errors[:3],
    }


def _rates(p: dict[str, Any]) -> dict[str, Any]:
    return {"token_hit_rate": p["token_hit_rate"],
            "hit_rate_by_tier": {t: p["hit_tokens"][t] / p["prompt_tokens"] for t in TIERS}}


def served_order(rep: Replay) -> list[tuple[int, int]]:
    return [(o.session, o.index) for o in sorted(rep.outcomes, key=lambda o: o.sent_s)]


def run(args: argparse.Namespace) -> int:
    k = args.tokens_per_trace_block
    if k < 1 or args.max_tokens < 1:
        raise EngineInputError("--tokens-per-trace-block and --max-tokens must be >= 1")
    for flag, v in (("--sessions", args.sessions),
                    ("--requests-per-session", args.requests_per_session)):
        if v is not None and v < 1:
            raise EngineInputError(f"{flag} must be >= 1")
    target = Target(args.target, args.api_key)
    models = target.get_json("/v1/models")["data"]
    model = args.model or models[0]["id"]
    info = _server_info(target)
    if info["block_tokens"] != k:
        raise EngineInputError(f"the server's blocks hold {info['block_tokens']} tokens; "
                               f"start it with --block-tokens {k}")
    sessions = load_sessions(args.traces, k, info["vocab_size"], args.vocab_low,
                             args.sessions, args.requests_per_session, args.format)
    longest = max(len(r.prompt) for s in sessions for r in s)
    if longest + args.max_tokens > info["max_context_tokens"]:
        raise EngineInputError(f"a scaled prompt has {longest} tokens, over the model's "
                               f"context of {info['max_context_tokens']}: lower "
                               "--tokens-per-trace-block")
    block_bytes = info["block_bytes"]
    dram_blocks = parse_size(args.dram) // block_bytes
    ssd_blocks = parse_size(args.ssd) // block_bytes
    prediction = predict(sessions, k, info["pool_tokens"], dram_blocks, ssd_blocks)
    mooncake = trace_format(args.traces, args.format) == "mooncake"
    concurrency = args.concurrency or (MOONCAKE_CONCURRENCY if mooncake else len(sessions))
    if concurrency < 1:
        raise EngineInputError("--concurrency must be >= 1")
    rep = replay(target, model, sessions, args.max_tokens, concurrency,
                 progress=not args.json)
    served = predict(sessions, k, info["pool_tokens"], dram_blocks, ssd_blocks,
                     served_order(rep))
    out = report(rep, prediction, served)
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print(out)
    return 1 if rep.errors else 0


def _server_info(target: Target) -> dict[str, int]:
    """Block size, pool, vocabulary and context of the server (its ``/v1/models`` entry)."""
    m = target.get_json("/v1/models")["data"][0]
    try:
        return {key: int(m["kvengine"][key]) for key in
                ("block_tokens", "pool_tokens", "block_bytes", "vocab_size",
                 "max_context_tokens")}
    except (KeyError, TypeError, ValueError):
        raise EngineInputError("the target is not a kvengine serve (no 'kvengine' field in "
                               "/v1/models)") from None


def _print(out: dict[str, Any]) -> None:
    t = out["ttft_s"]
    print(f"{out['requests']} requests ({out['errors']} errors) from {out['sessions']} sessions "
          f"in {out['wall_s']:.1f} s: {out['requests_per_s']:.2f} req/s, "
          f"{out['prompt_tokens_per_s']:.0f} prompt tok/s")
    print(f"TTFT p50 {t['p50'] * 1e3:.1f} ms  p90 {t['p90'] * 1e3:.1f} ms  "
          f"p99 {t['p99'] * 1e3:.1f} ms")
    parts = "  ".join(f"{p} {v['mean'] * 1e3:.1f} ms" for p, v in out["ttft_parts_s"].items())
    print(f"TTFT mean parts: {parts}")
    measured = "  ".join(f"{t} {v:.3f}" for t, v in out["hit_rate_by_tier"].items())
    predicted = "  ".join(f"{t} {v:.3f}" for t, v in out["predicted"]["hit_rate_by_tier"].items())
    print(f"token hit rate {out['token_hit_rate']:.4f} (by tier: {measured})")
    print(f"predicted      {out['predicted']['token_hit_rate']:.4f} (by tier: {predicted}; "
          f"in trace order {out['predicted_trace_order']['token_hit_rate']:.4f})")
