"""The requests ``kvengine bench-serve`` sends: agent traces (kv-cache-tester sessions or
Mooncake JSONL) scaled to ``k`` tokens a trace block, grouped into sessions.

Real agent prompts are far beyond a CPU (median 115 K tokens), so each trace block becomes
``k`` tokens (``--tokens-per-trace-block``; start the server with ``--block-tokens k``):
equal trace hash ids (kv-cache-tester's within a session, as the trace scopes them;
Mooncake's across the trace) give equal token ids, and every request also gets a short
unique tail (the trace's partial last block, scaled, at least one token), so its full
blocks can all hit.

It stands apart from ``engine.server.bench_serve`` (the replay through a server, the
simulator's prediction and the report) because the scaling is what both sides must agree
on: the replay sends these prompts and the prediction feeds the same keys to the
simulator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.errors import EngineInputError
from kvstore.hitrate.errors import HitrateError
from kvstore.hitrate.readers.detect import open_inputs
from kvstore.hitrate.request import Request


@dataclass(frozen=True, slots=True)
class ScaledRequest:
    session: int
    time_s: float  # trace time (for the prediction's order)
    keys: list[int]  # the trace's hash ids, scoped to the session by the reader
    tail_tokens: int
    prompt: list[int]


def load_sessions(paths: list[str], k: int, vocab: int, low: int, n_sessions: int | None,
                  per_session: int | None, fmt: str = "auto") -> list[list[ScaledRequest]]:
    """The scaled requests, grouped into sessions. kv-cache-tester: a file is a session
    (files in name order; the first ``n_sessions``, each's first ``per_session`` requests).
    Mooncake has no sessions: each request is a session of one, in trace time order (the
    first ``n_sessions`` requests), so the closed loop keeps ``--concurrency`` requests in
    flight in trace order."""
    if vocab - low < 2:
        raise EngineInputError(f"--vocab-low {low} leaves no token ids below {vocab}")
    try:
        reader = open_inputs(paths, fmt=fmt)
    except HitrateError as e:
        raise EngineInputError(str(e)) from None
    if reader.format not in ("kv-cache-tester", "mooncake"):
        raise EngineInputError(f"{reader.format} traces carry no prompts' blocks to replay: "
                               "give kv-cache-tester or Mooncake traces")
    unique = iter(range(1 << 62))
    sessions: list[list[ScaledRequest]] = []
    try:
        if reader.format == "mooncake":
            for req in itertools.islice(reader.requests(), n_sessions):
                sessions.append([_scale(req, len(sessions), k, vocab, low, next(unique))])
        else:
            for s, path in enumerate(reader.paths[:n_sessions]):
                reqs = itertools.islice(reader.file_requests(s, path), per_session)
                out = [_scale(req, len(sessions), k, vocab, low, next(unique)) for req in reqs]
                if out:
                    sessions.append(out)
    except HitrateError as e:
        raise EngineInputError(str(e)) from None
    if not sessions:
        raise EngineInputError("the traces hold no requests")
    return sessions


def trace_format(paths: list[str], fmt: str = "auto") -> str:
    try:
        return open_inputs(paths, fmt=fmt).format
    except HitrateError as e:
        raise EngineInputError(str(e)) from None


def _scale(req: Request, session: int, k: int, vocab: int, low: int,
           unique: int) -> ScaledRequest:
    """One trace request at ``k`` tokens a trace block: its full blocks' tokens follow from
    their ids; the rest (a partial last block, scaled, at least one token) is unique to the
    request, so every full block can hit and the partial one never does (as in the engine,
    which caches full blocks only)."""
    b = req.block_tokens
    full = min(len(req.keys), req.input_tokens // b)
    keys = [int(x) for x in req.keys[:full]]  # type: ignore[call-overload]  # ints here
    tail = max(1, math.ceil((req.input_tokens - full * b) * k / b))
    ids: list[int] = []
    for key in keys:
        ids.extend(block_tokens(key, k, low, vocab - low))
    rng = np.random.default_rng([0xC0FFEE, unique])
    ids.extend(int(t) for t in rng.integers(low, vocab, tail))
    return ScaledRequest(session, req.time_s, keys, tail, ids)


_BLOCKS: dict[tuple[int, int, int, int], list[int]] = {}


def block_tokens(key: int, k: int, low: int, span: int) -> list[int]:
    """The ``k`` token ids of a trace block: a function of its scoped id only."""
    got = _BLOCKS.get((key, k, low, span))
    if got is None:
        rng = np.random.default_rng([key & 0xFFFFFFFFFFFF, key >> 48, k])
        got = _BLOCKS[(key, k, low, span)] = [int(t) + low for t in rng.integers(0, span, k)]
    return got


def iter_prompts(sessions: list[list[ScaledRequest]]) -> Iterator[list[int]]:
    for s in sessions:
        for r in s:
            yield r.prompt
