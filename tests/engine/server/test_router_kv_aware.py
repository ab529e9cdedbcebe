"""vllm-router's ``kv_aware`` policy fed by two ``kvengine serve`` replicas' KV events: a
session's next turn goes to the replica whose pool holds its blocks.

The replicas share no store, so a turn's cached tokens come only from the pool of the replica
that served the turn before. Each session's first turn is sent straight to a replica chosen
here (half to each), bypassing the router: the router can learn where the blocks are only
from the events (its fallback with no hit, the least loaded replica, would send every
session to the same one)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.engine.server.conftest import BLOCK, MODEL, cached, client, words
from tests.engine.server.router_process import RouterProcess, _free_port
from tests.engine.server.serve_process import ServeProcess


@pytest.fixture(scope="module")
def fleet(tiny_dir: Path, env: dict[str, str]) -> Iterator[tuple[list[ServeProcess],
                                                                  RouterProcess]]:
    replicas: list[ServeProcess] = []
    router = None
    try:
        extra: list[str] = []
        for _ in range(2):
            pub, replay = (f"tcp://127.0.0.1:{_free_port()}" for _ in range(2))
            r = ServeProcess(["--model", str(tiny_dir), "--pool-tokens", "8192",
                              "--kv-events-endpoint", pub,
                              "--kv-events-replay-endpoint", replay], env)
            replicas.append(r)
            extra += ["--kv-event-source", f"{r.base_url}={pub}",
                      "--kv-event-replay-source", f"{r.base_url}={replay}"]
        router = RouterProcess([r.base_url for r in replicas], policy="kv_aware",
                               extra=(*extra, "--kv-event-block-size", str(BLOCK),
                                      "--kv-event-model", MODEL))
        yield replicas, router
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.stop()


def test_the_next_turn_goes_where_the_blocks_are(
        fleet: tuple[list[ServeProcess], RouterProcess]) -> None:
    replicas, router = fleet
    via_router = openai.OpenAI(base_url=router.base_url + "/v1", api_key="none",
                               max_retries=0, timeout=60)
    sessions = [words(300, seed=40 + s) for s in range(4)]
    firsts = []
    for s, prompt in enumerate(sessions):
        first = client(replicas[s % 2]).completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
        firsts.append(first)
    time.sleep(1.0)  # the events cross ZMQ to the router
    for prompt, first in zip(sessions, firsts, strict=True):
        turn = prompt + first.choices[0].text + " and then the next question"
        second = via_router.completions.create(model=MODEL, prompt=turn, max_tokens=4,
                                               temperature=0)
        # The replica that served the first turn holds every full block of its prompt.
        assert first.usage is not None
        assert cached(second.usage) >= first.usage.prompt_tokens // BLOCK * BLOCK - BLOCK
