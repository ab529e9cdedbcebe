"""``kvengine serve --kv-events-endpoint``: batches a subscriber decodes with vLLM's schema
(and, where vLLM's venv exists, with vLLM's own classes), consecutive sequence numbers, the
replay endpoint resending what a subscriber missed, and a real server's pool announcing the
blocks it indexes (their chain, their tokens) and those it evicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EngineInputError
from engine.model.tokenizer import Tokenizer
from engine.server.kv_events import (
    KvEventsConfig,
    ZmqKvEventPublisher,
    cleared_event,
    encode_batch,
    removed_event,
    stored_event,
)
from tests.clients.vllm_connector.vllm_procs import vllm_python
from tests.engine.server.conftest import MODEL, words
from tests.engine.server.kv_event_subscriber import (
    DECODER,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Received,
    Subscriber,
    events,
)
from tests.engine.server.serve_process import REPO, ServeProcess

LOOPBACK = "tcp://127.0.0.1:0"
LAYERS = frozenset({0})  # a listener argument vLLM's events do not carry


@pytest.fixture
def publisher() -> Iterator[ZmqKvEventPublisher]:
    pub = ZmqKvEventPublisher(KvEventsConfig(LOOPBACK, LOOPBACK, block_tokens=4))
    yield pub
    pub.close()


def joined(pub: ZmqKvEventPublisher) -> Subscriber:
    """A subscriber that has seen a batch (a PUB drops what it sends before a SUB joins)."""
    sub = Subscriber(str(pub.endpoint), pub.replay_endpoint)
    deadline = time.monotonic() + 10
    while sub.recv(0.1) is None:
        assert time.monotonic() < deadline, "the subscriber never joined"
        pub.all_cleared()
    return sub


def test_batches_decode_with_vllms_schema_in_sequence(publisher: ZmqKvEventPublisher) -> None:
    sub = joined(publisher)
    try:
        k1, k2 = b"\x01" * 32, b"\x02" * 32
        publisher.block_stored(0, k1, LAYERS, None, [1, 2, 3, 4])
        publisher.block_stored(1, k2, LAYERS, k1, [5, 6, 7, 8])
        publisher.block_removed(1, k2)
        publisher.all_cleared()
        got = sub.recv_until(lambda g: len([e for e in events(g)
                                            if not isinstance(e, AllBlocksCleared)]) >= 3
                             and isinstance(events(g)[-1], AllBlocksCleared))
        seqs = [r.seq for r in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert all(r.batch.data_parallel_rank == 0 for r in got)
        evs = [e for e in events(got)
               if not (isinstance(e, AllBlocksCleared) and e is not events(got)[-1])]
        assert evs == [
            BlockStored(block_hashes=[k1], parent_block_hash=None, token_ids=[1, 2, 3, 4],
                        block_size=4, lora_id=None, medium="GPU", lora_name=None),
            BlockStored(block_hashes=[k2], parent_block_hash=k1, token_ids=[5, 6, 7, 8],
                        block_size=4, lora_id=None, medium="GPU", lora_name=None),
            BlockRemoved(block_hashes=[k2], medium="GPU"),
            AllBlocksCleared(),
        ]
        # The replay endpoint resends every buffered batch from the asked seq on, the same
        # bytes as went out live, from batch 0 (the clear a fresh publisher starts with).
        everything = sub.replay(0)
        assert [r.seq for r in everything] == list(range(seqs[-1] + 1))
        assert isinstance(everything[0].batch.events[0], AllBlocksCleared)
        live = {r.seq: r.payload for r in got}
        assert all(r.payload == live[r.seq] for r in everything if r.seq in live)
        assert [r.seq for r in sub.replay(seqs[-1])] == [seqs[-1]]
        assert sub.replay(seqs[-1] + 1) == []
    finally:
        sub.close()


@pytest.mark.parametrize("endpoint", ["ipc:///tmp/x", "tcp://127.0.0.1", "tcp://999.0.0.1:1"])
def test_a_bad_endpoint_is_one_clear_error(endpoint: str) -> None:
    with pytest.raises(EngineInputError, match="--kv-events-endpoint"):
        ZmqKvEventPublisher(KvEventsConfig(endpoint, None, block_tokens=4))


def test_an_endpoint_in_use_is_refused(publisher: ZmqKvEventPublisher) -> None:
    with pytest.raises(EngineInputError, match="--kv-events-replay-endpoint"):
        ZmqKvEventPublisher(KvEventsConfig(LOOPBACK, publisher.replay_endpoint,
                                           block_tokens=4))


_VLLM_DECODE = """
import json, sys
from vllm.distributed.kv_events import KVEventBatch
import msgspec
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
out = []
for hexed in json.load(open(sys.argv[1])):
    batch = dec.decode(bytes.fromhex(hexed))
    out.append([[type(e).__name__, [h.hex() for h in getattr(e, "block_hashes", [])],
                 getattr(e, "token_ids", None)] for e in batch.events])
print(json.dumps(out))
"""


def test_vllms_own_classes_decode_the_batches(publisher: ZmqKvEventPublisher,
                                              tmp_path: Path) -> None:
    python = vllm_python()
    publisher.block_stored(0, b"\x03" * 32, LAYERS, None, [9, 8, 7, 6])
    publisher.block_removed(0, b"\x03" * 32)
    sub = Subscriber(str(publisher.endpoint), publisher.replay_endpoint)
    try:
        deadline = time.monotonic() + 10
        while len(got := sub.replay(0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # queued events reach the buffer on the publisher thread
    finally:
        sub.close()
    (tmp_path / "batches.json").write_text(json.dumps([r.payload.hex() for r in got]))
    out = subprocess.run([str(python), "-c", _VLLM_DECODE, str(tmp_path / "batches.json")],
                         capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    decoded = [e for batch in json.loads(out.stdout.splitlines()[-1]) for e in batch]
    assert decoded == [["AllBlocksCleared", [], None],
                       ["BlockStored", ["03" * 32], [9, 8, 7, 6]],
                       ["BlockRemoved", ["03" * 32], None]]


def _endpoints(server: ServeProcess) -> tuple[str, str]:
    (line,) = [ln for ln in server.stdout_lines if ln.startswith("kv events on ")]
    pub, replay = line.removeprefix("kv events on ").split(", replay on ")
    return pub, replay


def test_serve_announces_its_pool(tiny_dir: Path, env: dict[str, str]) -> None:
    bt = 16
    with ServeProcess(["--model", str(tiny_dir), "--block-tokens", str(bt),
                       "--pool-tokens", str(10 * bt), "--no-cache-generated",
                       "--kv-events-endpoint", LOOPBACK,
                       "--kv-events-replay-endpoint", LOOPBACK], env) as server:
        sub = Subscriber(*_endpoints(server))
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none",
                               max_retries=0, timeout=60)
        tok = Tokenizer.from_dir(tiny_dir)
        try:
            prompts = [words(30, seed=s) for s in (21, 22)]  # ~7 blocks each: B evicts A
            for p in prompts:
                client.completions.create(model=MODEL, prompt=p, max_tokens=1, temperature=0)
            deadline = time.monotonic() + 20
            while True:  # the publisher thread batches what the engine queued
                got = sub.replay(0)
                if any(isinstance(e, BlockRemoved) for e in events(got)):
                    break
                assert time.monotonic() < deadline, f"no removal in {events(got)}"
                time.sleep(0.1)
        finally:
            sub.close()
    _check_announced(got, [tok.encode(p) for p in prompts], bt)


def _check_announced(got: list[Received], prompts: list[list[int]], bt: int) -> None:
    assert [r.seq for r in got] == list(range(len(got)))
    evs = events(got)
    assert isinstance(evs[0], AllBlocksCleared)
    stored = [e for e in evs if isinstance(e, BlockStored)]
    assert all(e.block_size == bt and len(e.token_ids) == bt and len(e.block_hashes) == 1
               for e in stored)
    chains: list[list[BlockStored]] = []
    for e in stored:  # each chain starts at a parentless block, the rest follow it
        if e.parent_block_hash is None:
            chains.append([e])
        else:
            assert e.parent_block_hash == chains[-1][-1].block_hashes[0]
            chains[-1].append(e)
    assert len(chains) == 2
    for chain, ids in zip(chains, prompts, strict=True):
        assert len(chain) == len(ids) // bt  # every full block of the prompt
        assert [t for e in chain for t in e.token_ids] == ids[: len(chain) * bt]
    removed = [h for e in evs if isinstance(e, BlockRemoved) for h in e.block_hashes]
    first = [e.block_hashes[0] for e in chains[0]]
    assert removed and removed == first[::-1][: len(removed)]  # the first chain, tail first


@pytest.mark.parametrize("flags", [["--kv-events-replay-endpoint", "tcp://127.0.0.1:0"],
                                   ["--kv-events-endpoint", "ipc:///tmp/kv-events"]])
def test_serve_refuses_bad_event_flags_in_one_line(tiny_dir: Path, env: dict[str, str],
                                                   flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--model",
                           str(tiny_dir), "--listen", "127.0.0.1:0", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kv-events" in lines[0], done.stderr


_keys = st.binary(min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("stored"), _keys, st.none() | _keys,
              st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(1, 1024)),
    st.tuples(st.just("removed"), _keys),
    st.just(("cleared",))), max_size=20), st.floats(0, 2e9))
def test_every_batch_decodes_to_what_was_encoded(ops: list[tuple], ts: float) -> None:
    events, want = [], []
    for op in ops:
        if op[0] == "stored":
            _, key, parent, tokens, size = op
            events.append(stored_event(key, parent, tokens, size))
            want.append(BlockStored(block_hashes=[key], parent_block_hash=parent,
                                    token_ids=tokens, block_size=size, lora_id=None,
                                    medium="GPU", lora_name=None))
        elif op[0] == "removed":
            events.append(removed_event(op[1]))
            want.append(BlockRemoved(block_hashes=[op[1]], medium="GPU"))
        else:
            events.append(cleared_event())
            want.append(AllBlocksCleared())
    batch = DECODER.decode(encode_batch(events, ts))
    assert batch.events == want and batch.ts == ts and batch.data_parallel_rank == 0


def test_reset_prefix_cache_clears_the_pool_and_says_so(tiny_dir: Path,
                                                        env: dict[str, str]) -> None:
    """``POST /reset_prefix_cache`` (vLLM's route): the pool forgets its prefix index, the
    events announce ``AllBlocksCleared`` after the blocks stored, and the same prompt is
    then computed again; while a request holds blocks nothing is reset (409)."""
    bt = 16
    with ServeProcess(["--model", str(tiny_dir), "--block-tokens", str(bt),
                       "--pool-tokens", str(64 * bt), "--no-cache-generated",
                       "--kv-events-endpoint", LOOPBACK,
                       "--kv-events-replay-endpoint", LOOPBACK], env) as server:
        sub = Subscriber(*_endpoints(server))
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none",
                               max_retries=0, timeout=60)
        prompt = words(30, seed=23)
        try:
            def cached() -> int:
                r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                              temperature=0)
                assert r.usage is not None and r.usage.prompt_tokens_details is not None
                return r.usage.prompt_tokens_details.cached_tokens or 0

            assert cached() == 0
            assert cached() > 0  # the pool holds the prompt
            # A streamed request holds its blocks while it runs: nothing is reset. (Its
            # first chunk, the role, comes before the engine admits it: a reset may still
            # succeed until the next step, so ask until it answers 409.)
            with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=60,
                              json={"model": MODEL, "max_tokens": 800, "ignore_eos": True,
                                    "messages": [{"role": "user", "content": words(20, 24)}],
                                    "stream": True}) as running:
                lines = running.iter_lines()
                next(lines)  # submitted
                for _ in range(200):
                    busy = httpx.post(server.base_url + "/reset_prefix_cache", timeout=60)
                    if busy.status_code != 200:
                        break
                    time.sleep(0.005)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["code"] == "prefix_cache_in_use"
            deadline = time.monotonic() + 30
            while (r := httpx.post(server.base_url + "/reset_prefix_cache",
                                   timeout=60)).status_code == 409:
                assert time.monotonic() < deadline, "the aborted stream still holds blocks"
                time.sleep(0.1)
            assert r.status_code == 200, r.text
            assert cached() == 0  # forgotten: computed again
            deadline = time.monotonic() + 20
            while True:
                evs = events(sub.replay(0))
                if any(isinstance(e, AllBlocksCleared) for e in evs[1:]):
                    break
                assert time.monotonic() < deadline, f"no AllBlocksCleared in {evs}"
                time.sleep(0.1)
            first_clear = next(i for i, e in enumerate(evs) if i and
                               isinstance(e, AllBlocksCleared))
            assert any(isinstance(e, BlockStored) for e in evs[1:first_clear])
        finally:
            sub.close()
