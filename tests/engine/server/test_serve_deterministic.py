"""``kvengine serve --deterministic`` over HTTP: one seeded completion gives the same text
and bitwise the same logprobs when it runs alone and when it runs while seven other
requests decode beside it (the engine loop batches whatever is admitted, so its steps are
shared with theirs, and its prefill is chunked between their decodes by a small budget).
Without the flag the same run gives other logprobs, so the test can fail."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import openai

from tests.engine.server.conftest import MODEL, client, wait_for, words
from tests.engine.server.serve_process import ServeProcess

OTHERS = 7


def _serve(tiny_dir: Path, env: dict[str, str], *flags: str) -> ServeProcess:
    # bfloat16: the dtype where a batch's row count changes a product's bits without the
    # flag; a 48-token budget splits the request's prefill between the others' decodes.
    return ServeProcess(["--model", str(tiny_dir), *flags, "--dtype", "bfloat16",
                         "--max-batched-tokens", "48"], env)


def _mine(c: openai.OpenAI) -> tuple[str, list[Any], list[Any]]:
    r = c.completions.create(model=MODEL, prompt=words(120, seed=77), max_tokens=10,
                             temperature=0.9, seed=5, logprobs=5,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == 10
    return r.choices[0].text, list(lp.token_logprobs), list(lp.top_logprobs)


def _alone_and_among_others(
        server: ServeProcess) -> tuple[tuple[str, list[Any], list[Any]], ...]:
    c = client(server)
    alone = _mine(c)
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def other(i: int) -> None:
        try:
            t0 = time.monotonic()
            client(server).completions.create(
                model=MODEL, prompt=words(30 + 23 * i, seed=i), max_tokens=60,
                temperature=0.7, seed=i, extra_body={"ignore_eos": True})
            spans.append((t0, time.monotonic()))
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(OTHERS)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: server.metric("kvengine_requests_running") >= 3,
                        timeout_s=120), "the other requests never ran"
        start = time.monotonic()
        among = _mine(c)
        end = time.monotonic()
    finally:
        for t in threads:
            t.join(timeout=600)
    assert not errors, errors
    # Some of the others were still decoding when mine finished: its steps were shared.
    assert sum(1 for t0, t1 in spans if t0 < start and t1 > end) >= 1, (spans, start, end)
    return alone, among


def test_alone_and_among_others_give_the_same_bits(tiny_dir: Path, env: dict[str, str]
                                                   ) -> None:
    with _serve(tiny_dir, env, "--deterministic") as server:
        alone, among = _alone_and_among_others(server)
    assert among[0] == alone[0]
    assert among[1] == alone[1]  # floats compared exactly: bitwise the same
    assert among[2] == alone[2]


def test_without_the_flag_the_logprobs_differ(tiny_dir: Path, env: dict[str, str]) -> None:
    # The reference kernels: oneDNN's GEMM (its blocking follows the row count) and the torch
    # attention backend. The CPU defaults (bf16gemv, the fused per-row ops, cpu_paged) give
    # a row the same bits in any batch here, so they cannot show the condition bites.
    with _serve(tiny_dir, {**env, "KERNELS_LINEAR": "onednn"},
                "--attention-backend", "torch") as server:
        alone, among = _alone_and_among_others(server)
    assert among[1] != alone[1]
