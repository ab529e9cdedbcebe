"""A request's prompt goes to the store when its prefill completes, not when it ends
(``StoreConnector.on_prefilled``, issue 32): two engines over the stand-in model share a
real ``kvstore serve`` daemon, and the second one's lookup, right after the first one's
first token (its commit over, the request still decoding), sees the prompt's full blocks.
Before, a request committed only when it finished, so a session's next turn routed to
another replica missed what the first replica had just computed.

Also: the request's end sends only what lies past its prompt's commit (generated blocks),
a commit dropped under back-pressure is counted and costs nothing else, and a preempted
request does not send its prompt twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clients.sync_client import GrpcStore
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.tier import KVStore
from tests.engine.engine_harness import BT, WrappedStore, dram_store, fake_engine

LONG = SamplingParams(max_new_tokens=40)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with DaemonProcess(["--dram", "16MiB"]) as d:
        yield d


def grpc_store(daemon: DaemonProcess) -> KVStore:
    return GrpcStore.from_url(daemon.url, default_timeout_s=5.0)


def first_token(eng: LLMEngine, seq) -> None:  # type: ignore[no-untyped-def]
    while not seq.output_ids:
        eng.step()


def test_the_next_engine_sees_the_prompt_right_after_the_first_token(
        daemon: DaemonProcess) -> None:
    prompt = list(range(100, 100 + 9 * BT + 3))  # 9 full blocks and a partial one
    with fake_engine(grpc_store(daemon), cache_generated_tokens=False) as first, \
            fake_engine(grpc_store(daemon)) as second:
        seq = first.add_request(prompt, LONG)
        first_token(first, seq)
        assert not seq.is_finished  # it decodes on: 39 tokens to go
        pc = seq.prefill_commit
        assert pc is not None and pc.blocks == 9
        assert pc.receipt.wait(10) and pc.receipt.failed == 0
        assert second.visible_prompt_blocks(prompt) == 9
        # The second engine's request for the same prompt loads it from the store.
        other = second.add_request(prompt, SamplingParams(max_new_tokens=1))
        while not other.is_finished:
            second.step()
        assert other.stats.hit_tokens["dram"] == 9 * BT
        assert other.stats.computed_tokens == 3
        # Its end sends nothing more (no generated blocks are cached): one commit only.
        committed = first.store_counters()["committed_blocks_total"]
        while not seq.is_finished:
            first.step()
        assert first.drain(10)
        assert first.store_counters()["committed_blocks_total"] == committed == 9
        first.check_integrity()
        second.check_integrity()


def test_the_end_commits_only_the_generated_blocks() -> None:
    store = WrappedStore(dram_store())
    prompt = list(range(10, 10 + 4 * BT))  # 4 full blocks
    with fake_engine(store) as eng:  # generated tokens are cached (the default)
        seq = eng.add_request(prompt, SamplingParams(max_new_tokens=2 * BT + 1))
        first_token(eng, seq)
        assert seq.prefill_commit is not None and seq.prefill_commit.receipt.wait(10)
        assert [sorted(p) for p in store.commits] == [[0, 1, 2, 3]]
        while not seq.is_finished:
            eng.step()
        assert eng.drain(10)
        # The prompt plus 2 answer blocks (the last answer token is never computed).
        sent = [sorted(p) for p in store.commits]
        assert sent == [[0, 1, 2, 3], [4, 5]], sent
        eng.check_integrity()
    store.inner.close()


def test_a_prompt_commit_dropped_under_back_pressure_is_counted_and_sent_at_the_end(
        ) -> None:
    store = WrappedStore(dram_store())
    prompt = list(range(10, 10 + 3 * BT + 1))
    with fake_engine(store, cache_generated_tokens=False) as eng:
        eng.committer.staging.max_jobs = 0  # every commit is dropped while it lasts
        seq = eng.add_request(prompt, SamplingParams(max_new_tokens=3))
        first_token(eng, seq)
        pc = seq.prefill_commit
        assert pc is not None and pc.blocks == 0 and pc.receipt.done
        assert pc.receipt.jobs == 0
        assert eng.store_counters()["commit_unsent_blocks_total"] == 3
        eng.committer.staging.max_jobs = 8
        while not seq.is_finished:
            eng.step()
        assert eng.drain(10)
        assert eng.visible_prompt_blocks(prompt) == 3  # the end sent what the prefill could not
        eng.check_integrity()
    store.inner.close()


def test_no_store_no_prompt_commit() -> None:
    with fake_engine(None) as eng:
        seq = eng.add_request(list(range(10, 30)), SamplingParams(max_new_tokens=2))
        while not seq.is_finished:
            eng.step()
        assert seq.prefill_commit is None
