"""Two ``kvengine serve`` replicas sharing one ``kvstore serve`` daemon, behind the real
vllm-router, driven by the official ``openai`` client: completions, chat and streaming go
through; a prompt computed on one replica is a store hit on the other (what the shared store
buys round-robin routing); a replica killed with SIGKILL is ejected and the next requests
still get the same tokens."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.server.conftest import BLOCK, MODEL, cached, words
from tests.engine.server.router_process import RouterProcess
from tests.engine.server.serve_process import ServeProcess


class Fleet:
    def __init__(self, replicas: list[ServeProcess], router: RouterProcess) -> None:
        self.replicas = replicas
        self.router = router
        self.client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="none",
                                    max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def fleet(tiny_dir: Path, env: dict[str, str]) -> Iterator[Fleet]:
    with DaemonProcess(["--dram", "64MiB"]) as daemon:
        replicas: list[ServeProcess] = []
        router = None
        try:  # whatever fails to start, what did start is stopped
            for _ in range(2):
                replicas.append(ServeProcess(["--model", str(tiny_dir), "--kv-store",
                                              daemon.url, "--pool-tokens", "4096"], env))
            router = RouterProcess([r.base_url for r in replicas], policy="round_robin")
            yield Fleet(replicas, router)
        finally:
            if router is not None:
                router.stop()
            for r in replicas:
                r.stop()


def test_completions_chat_and_streaming_through_the_router(fleet: Fleet) -> None:
    direct = openai.OpenAI(base_url=fleet.replicas[0].base_url + "/v1", api_key="none",
                           max_retries=0, timeout=60)
    prompt = words(40, seed=1)
    want = direct.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    for _ in range(2):  # round-robin: once on each replica
        got = fleet.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                              temperature=0)
        assert got.choices[0].text == want.choices[0].text
    chat = fleet.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": words(20, seed=2)}],
        max_tokens=6, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length")
    stream = fleet.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": words(20, seed=2)}],
        max_tokens=6, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content


def test_the_other_replica_hits_the_shared_store(fleet: Fleet) -> None:
    prompt = words(400, seed=3)  # several blocks, new to both replicas
    first = fleet.client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                            temperature=0)
    assert cached(first.usage) == 0
    # The next request goes to the other replica, whose pool never saw the prompt: its hit
    # comes from the daemon once the first replica's commit has landed there.
    deadline = time.monotonic() + 30
    while True:
        again = fleet.client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                                temperature=0)
        if cached(again.usage) > 0 or time.monotonic() > deadline:
            break
    assert cached(again.usage) >= (first.usage.prompt_tokens - 1) // BLOCK * BLOCK - BLOCK
    assert again.choices[0].text == first.choices[0].text


def test_a_killed_replica_is_ejected_and_requests_go_on(fleet: Fleet) -> None:
    prompt = words(30, seed=4)
    want = fleet.client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                           temperature=0).choices[0].text
    # A session only the doomed replica served: its blocks are in that replica's pool and,
    # once its commit has landed, in the daemon; never in the survivor's pool.
    session = words(400, seed=6)
    doomed = openai.OpenAI(base_url=fleet.replicas[1].base_url + "/v1", api_key="none",
                           max_retries=0, timeout=60)
    first = doomed.completions.create(model=MODEL, prompt=session, max_tokens=6, temperature=0)
    deadline = time.monotonic() + 30
    while fleet.replicas[1].metric("kvengine_store_jobs_pending") > 0:
        assert time.monotonic() < deadline, "the commit never reached the daemon"
        time.sleep(0.1)
    fleet.replicas[1].proc.send_signal(signal.SIGKILL)
    fleet.replicas[1].proc.wait(timeout=10)
    # The router retries a failed worker's request on another and ejects it after its
    # health checks fail: no request fails, every answer is the same.
    for _ in range(4):
        got = fleet.client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                              temperature=0)
        assert got.choices[0].text == want
    # The session goes on on the survivor, from the store: the same answer, its prompt's
    # blocks (all but the last partial one) loaded rather than computed.
    again = fleet.client.completions.create(model=MODEL, prompt=session, max_tokens=6,
                                            temperature=0)
    assert again.choices[0].text == first.choices[0].text
    assert cached(again.usage) >= (first.usage.prompt_tokens - 1) // BLOCK * BLOCK - BLOCK
