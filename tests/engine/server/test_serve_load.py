"""``kvengine serve`` under load and departures: a full queue (503 with Retry-After),
clients that go away mid-request, and the metrics two requests leave behind (tokens by
source, latencies, store calls)."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest

from tests.engine.server.conftest import (
    MODEL,
    TOKENS,
    cached,
    client,
    store_calls,
    wait_for,
    words,
)
from tests.engine.server.serve_process import ServeProcess


def long_stream(c: openai.OpenAI, **extra: object):  # type: ignore[no-untyped-def]
    return c.completions.create(model=MODEL, prompt=words(20, seed=9), max_tokens=6000,
                                temperature=0, stream=True,
                                extra_body={"ignore_eos": True, **extra})


def test_full_queue_is_503_with_retry_after_and_a_disconnect_frees_it(
        plain: ServeProcess) -> None:
    c = client(plain)
    aborted = plain.metric("kvengine_requests_total", 'finish_reason="abort"')
    stream = long_stream(c)
    next(iter(stream))  # the request is in flight
    # /health answers while the engine works.
    assert httpx.get(plain.base_url + "/health", timeout=5).status_code == 200
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
    assert e.value.body["code"] == "server_overloaded"  # type: ignore[index]
    stream.close()  # the client goes away mid-stream
    assert wait_for(lambda: plain.metric("kvengine_requests_total",
                                         'finish_reason="abort"') == aborted + 1)
    assert plain.metric("kvengine_requests_running") == 0
    assert plain.metric("kvengine_pool_used_blocks") == 0
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=1)  # room again
    assert r.usage is not None and r.usage.completion_tokens == 1


def test_disconnect_of_an_unstreamed_request_frees_it(server: ServeProcess) -> None:
    aborted = server.metric("kvengine_requests_total", 'finish_reason="abort"')
    body = {"model": MODEL, "prompt": words(20), "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=1.0,
                   headers={"Authorization": f"Bearer {TOKENS['bob']}"})
    assert wait_for(lambda: server.metric("kvengine_requests_total",
                                          'finish_reason="abort"') == aborted + 1)
    assert wait_for(lambda: server.metric("kvengine_pool_used_blocks") == 0)


def test_metrics_count_tokens_by_source_and_latencies(server: ServeProcess,
                                                      alice: openai.OpenAI) -> None:
    # The package's server has served other tests: compare counts before and after.
    parts = ("queue", "store_lookup", "store_load", "compute")
    watched = [("kvengine_prompt_tokens_total", 'source="hbm"'),
               ("kvengine_prompt_tokens_total", 'source="computed"'),
               ("kvengine_time_to_first_token_seconds_count", ""),
               ("kvengine_time_per_output_token_seconds_count", ""),
               *[("kvengine_ttft_part_seconds_count", f'part="{p}"') for p in parts]]
    calls_before = store_calls(server)  # none in flight from the tests before
    before = [server.metric(*w) for w in watched]
    prompt = words(100, seed=10)
    usages = []
    for _ in range(2):  # ignore_eos: 3 tokens each, so each request has a time per token
        r = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == 3
        usages.append(r.usage)
    # Observed on the engine thread before each response is sent: no waiting needed.
    delta = dict(zip(watched, (server.metric(*w) - b for w, b in zip(watched, before,
                                                                       strict=True)),
                     strict=True))
    n = usages[0].prompt_tokens
    hit = (n - 1) // 64 * 64  # the second request: the pool's full blocks of the first
    assert (cached(usages[0]), cached(usages[1]), usages[1].prompt_tokens) == (0, hit, n)
    assert delta[watched[0]] == hit
    assert delta[watched[1]] == n + (n - hit)
    assert all(delta[w] == 2 for w in watched[2:]), delta
    # The first request finds nothing in the pool and asks the store: one lookup, a miss,
    # so no get. The second finds in the pool every block it may take and asks nothing.
    # Each commits its chain once when it finishes (the whole chain, even when the store
    # holds it: that refreshes its recency), after its response: store_calls waits.
    calls = store_calls(server)
    assert {c: calls[c] - calls_before[c] for c in calls} == {
        "lookup": 1, "get": 0, "commit": 2}
    assert server.metric("kvengine_pool_blocks") == 4096 // 64
