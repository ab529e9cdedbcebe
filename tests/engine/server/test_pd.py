"""Prefill/decode disaggregation through the store: the real vllm-router in its vLLM PD
mode (``--vllm-pd-disaggregation``) in front of a ``--kv-role prefill`` and a ``--kv-role
decode`` replica of ``kvengine serve`` sharing one ``kvstore serve`` daemon, driven by the
official ``openai`` client, against a co-located replica (no store) for the greedy tokens.

The router answers with the decode replica's response but reports the prefill's
``cached_tokens`` (vLLM's PD accounting: the prefill owns the prompt cache), so what the
decode replica computed is read from its own metrics (``kvengine_prompt_tokens_total``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.server.conftest import BLOCK, MODEL, client, words
from tests.engine.server.router_process import RouterProcess
from tests.engine.server.serve_process import REPO, ServeProcess

TIMEOUT_S = 3  # the replicas' --kv-transfer-timeout


class PD:
    def __init__(self, prefill: ServeProcess, decode: ServeProcess, colocated: ServeProcess,
                 router: RouterProcess) -> None:
        self.prefill, self.decode, self.colocated, self.router = (prefill, decode, colocated,
                                                                  router)
        self.client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="none",
                                    max_retries=0, timeout=60)

    def decode_sources(self) -> dict[str, float]:
        return {s: self.decode.metric("kvengine_prompt_tokens_total", f'source="{s}"')
                for s in ("hbm", "dram", "ssd", "computed")}

    def transfers(self, server: ServeProcess, side: str, outcome: str) -> float:
        return server.metric("kvengine_kv_transfers_total",
                             f'outcome="{outcome}",side="{side}"')


@pytest.fixture(scope="module")
def pd(tiny_dir: Path, env: dict[str, str]) -> Iterator[PD]:
    with DaemonProcess(["--dram", "64MiB"]) as daemon:
        common = ["--model", str(tiny_dir), "--kv-store", daemon.url, "--pool-tokens", "4096",
                  "--kv-transfer-timeout", f"{TIMEOUT_S}s"]
        started: list[ServeProcess] = []
        router = None
        try:  # whatever fails to start, what did start is stopped
            for role in ("prefill", "decode"):
                started.append(ServeProcess([*common, "--kv-role", role], env))
            started.append(ServeProcess(["--model", str(tiny_dir), "--pool-tokens", "4096"],
                                        env))
            router = RouterProcess([started[0].base_url], decode=[started[1].base_url])
            yield PD(*started, router)
        finally:
            if router is not None:
                router.stop()
            for s in started:
                s.stop()


def _computed_at_most_the_last_block(pd: PD, before: dict[str, float],
                                     prompt_tokens: int) -> None:
    after = pd.decode_sources()
    computed = after["computed"] - before["computed"]
    loaded = after["dram"] - before["dram"] + after["ssd"] - before["ssd"]
    assert computed <= BLOCK, (computed, prompt_tokens)
    assert loaded == (prompt_tokens - 1) // BLOCK * BLOCK  # every full block bar a cap


def test_completions_through_the_pd_router_match_a_co_located_replica(pd: PD) -> None:
    prompt = words(300, seed=11)
    want = client(pd.colocated).completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                                   temperature=0)
    before = pd.decode_sources()
    done = pd.transfers(pd.prefill, "prefill", "complete")
    got = pd.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                       temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == 8
    assert pd.transfers(pd.prefill, "prefill", "complete") == done + 1
    _computed_at_most_the_last_block(pd, before, want.usage.prompt_tokens)


def test_chat_and_streaming_through_the_pd_router(pd: PD) -> None:
    messages = [{"role": "user", "content": words(250, seed=12)}]
    want = client(pd.colocated).chat.completions.create(model=MODEL, messages=messages,
                                                        max_tokens=6, temperature=0)
    before = pd.decode_sources()
    got = pd.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                            temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    _computed_at_most_the_last_block(pd, before, want.usage.prompt_tokens)
    streamed = [{"role": "user", "content": words(260, seed=13)}]
    want = client(pd.colocated).chat.completions.create(model=MODEL, messages=streamed,
                                                        max_tokens=6, temperature=0)
    before = pd.decode_sources()
    chunks = list(pd.client.chat.completions.create(
        model=MODEL, messages=streamed, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    _computed_at_most_the_last_block(pd, before, want.usage.prompt_tokens)


def test_the_prefill_answers_with_what_the_decode_replica_needs(pd: PD) -> None:
    prompt = words(200, seed=14)
    r = httpx.post(pd.prefill.base_url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "min_tokens": 1, "temperature": 0,
        # vLLM's NixlConnector fields mean nothing here; an unknown one is ignored.
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                               "remote_engine_id": None, "remote_block_ids": None,
                               "remote_host": None, "remote_port": None, "not_a_field": 1}})
    assert r.status_code == 200, r.text
    body = r.json()
    params = body["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    # The store serves every full block of the prompt by the time the prefill answers.
    assert params["kvstore_blocks"] == body["usage"]["prompt_tokens"] // BLOCK
    assert len(bytes.fromhex(params["kvstore_namespace"])) == 16
    # min_tokens on a request that is not a prefill's is refused (its effect would be lost).
    r = httpx.post(pd.prefill.base_url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "min_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_a_decode_whose_blocks_never_arrive_computes_them_within_the_timeout(pd: PD) -> None:
    """The prefill replica died after answering (or never committed): the blocks it
    reported never show up in the store."""
    prompt = words(220, seed=15)
    want = client(pd.colocated).completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                                   temperature=0)
    ns = httpx.post(pd.prefill.base_url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "x", "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}}).json()["kv_transfer_params"]
    timeouts = pd.transfers(pd.decode, "decode", "timeout")
    start = time.monotonic()
    r = client(pd.decode).completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
        extra_body={"kv_transfer_params": {"do_remote_prefill": True, "kvstore_blocks": 3,
                                           "kvstore_namespace": ns["kvstore_namespace"]}})
    assert time.monotonic() - start < TIMEOUT_S + 30  # bounded: no hang past the timeout
    assert r.choices[0].text == want.choices[0].text
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # computed, not an error
    assert pd.transfers(pd.decode, "decode", "timeout") == timeouts + 1


def test_another_namespace_is_computed_at_once(pd: PD) -> None:
    prompt = words(120, seed=16)
    mismatches = pd.transfers(pd.decode, "decode", "namespace_mismatch")
    r = client(pd.decode).completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
        extra_body={"kv_transfer_params": {"do_remote_prefill": True, "kvstore_blocks": 1,
                                           "kvstore_namespace": "00" * 16}})
    assert r.usage.completion_tokens == 3
    assert pd.transfers(pd.decode, "decode", "namespace_mismatch") == mismatches + 1


@pytest.mark.parametrize(("replica", "params", "stream", "code"), [
    ("prefill", {"do_remote_prefill": True}, False, "kv_role_mismatch"),
    ("decode", {"do_remote_decode": True}, False, "kv_role_mismatch"),
    ("colocated", {"do_remote_decode": True, "do_remote_prefill": True}, False,
     "kv_role_mismatch"),
    ("colocated", {"do_remote_decode": True}, True, "kv_role_mismatch"),
    ("colocated", [1], False, "invalid_value"),
    ("colocated", {"do_remote_prefill": "yes"}, False, "invalid_value"),
    ("colocated", {"do_remote_prefill": True, "kvstore_blocks": -1}, False, "invalid_value"),
])
def test_a_request_the_role_does_not_fit_is_a_400(pd: PD, replica: str, params: object,
                                                  stream: bool, code: str) -> None:
    server = getattr(pd, replica)
    r = httpx.post(server.base_url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "a b c", "max_tokens": 2, "stream": stream,
        "kv_transfer_params": params})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == "kv_transfer_params"


def test_a_role_needs_a_shared_store(tiny_dir: Path, env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--model", str(tiny_dir),
                        "--kv-role", "decode", "--kv-store", "none"], cwd=REPO,
                       env={**os.environ, **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "grpc://" in lines[0], r.stderr


def test_a_dead_prefill_replica_is_a_clear_error_never_a_hang(pd: PD) -> None:
    """Last in the module: it kills the prefill replica. The router cannot get the prefill
    done, so it answers with an error at once (5xx): no decode request waits on blocks."""
    pd.prefill.proc.send_signal(signal.SIGKILL)
    pd.prefill.proc.wait(timeout=10)
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        pd.client.completions.create(model=MODEL, prompt=words(50, seed=17), max_tokens=4,
                                     temperature=0)
    assert e.value.status_code >= 500
    assert time.monotonic() - start < 60
    # The decode replica is untouched and still serves.
    assert client(pd.decode).completions.create(model=MODEL, prompt="a b", max_tokens=2,
                                                temperature=0).usage.completion_tokens == 2
