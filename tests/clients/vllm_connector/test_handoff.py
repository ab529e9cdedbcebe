"""The connector's side of the PD hand-off (``clients.vllm_connector.handoff``), without
vLLM: what a producer answers, when a consumer's request waits for its producer, and the
deadlines of the transfer's store calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clients.vllm_connector.handoff import (
    ConsumerWaits,
    commit_timeout_s,
    prefill_params,
    remote_prefill,
)
from kvstore.keys import Namespace

NS = Namespace("LlamaForCausalLM", "rev", "float32", "mha", (0, 1), 2, 8)
OTHER = Namespace("LlamaForCausalLM", "rev2", "float32", "mha", (0, 1), 2, 8)


def test_a_producer_answers_a_prefill_request_only() -> None:
    assert prefill_params(None, 300, 64, NS) is None
    assert prefill_params({"do_remote_prefill": True}, 300, 64, NS) is None
    assert prefill_params({"do_remote_decode": "yes"}, 300, 64, NS) is None
    got = prefill_params({"do_remote_decode": True, "remote_host": None}, 300, 64, NS)
    assert got == {"do_remote_prefill": True, "do_remote_decode": False, "kvstore_blocks": 4,
                   "kvstore_namespace": NS.fingerprint.hex()}
    # what kvengine's decode replica and this connector's consumer both read back
    wait = remote_prefill(got, NS, 0.0, 5.0)
    assert wait is not None and wait.blocks == 4 and wait.deadline_s == 5.0


def test_what_a_consumer_does_not_wait_for() -> None:
    ours = prefill_params({"do_remote_decode": True}, 300, 64, NS)
    assert ours is not None
    assert remote_prefill(ours, OTHER, 0.0, 5.0) is None  # another namespace
    assert remote_prefill({"do_remote_prefill": True, "remote_block_ids": [1]}, NS, 0, 5
                          ) is None  # NixlConnector's params: nothing of ours to wait for
    assert remote_prefill({**ours, "kvstore_blocks": 0}, NS, 0.0, 5.0) is None
    assert remote_prefill({**ours, "kvstore_blocks": True}, NS, 0.0, 5.0) is None
    assert remote_prefill({**ours, "do_remote_prefill": False}, NS, 0.0, 5.0) is None


@given(blocks=st.integers(1, 20), chain=st.integers(0, 20),
       hits=st.lists(st.integers(0, 20), min_size=1, max_size=8),
       step_s=st.floats(0.0, 3.0))
def test_a_consumer_waits_until_the_blocks_or_the_deadline(
        blocks: int, chain: int, hits: list[int], step_s: float) -> None:
    waits = ConsumerWaits(timeout_s=5.0)
    params = {"do_remote_prefill": True, "kvstore_blocks": blocks,
              "kvstore_namespace": NS.fingerprint.hex()}
    now = 100.0
    for hit in hits:
        waiting = waits.waiting("r", params, NS, hit, chain, now_s=now)
        enough = hit >= min(blocks, chain)
        assert waiting == (not enough and now < 105.0)
        if not waiting:
            assert len(waits) == 0
            break  # the request is looked up for good: it never asks again
        assert len(waits) == 1
        now += step_s
    waits.forget("r")
    assert len(waits) == 0


@given(blocks=st.integers(1, 20), waited_s=st.floats(0.0, 4.9), loaded_after_s=st.floats(0.0, 9.0))
def test_a_hand_offs_load_has_what_is_left_of_the_transfer_budget(
        blocks: int, waited_s: float, loaded_after_s: float) -> None:
    """The CI flake (the consumer loaded 0 of 630 tokens): one load slower than
    ``call_timeout_s`` threw the producer's whole prefill away. A hand-off's load may take
    what is left of ``kv_transfer_timeout_s`` (never less than one call's deadline)."""
    waits = ConsumerWaits(timeout_s=5.0)
    params = {"do_remote_prefill": True, "kvstore_blocks": blocks,
              "kvstore_namespace": NS.fingerprint.hex()}
    assert waits.waiting("r", params, NS, 0, blocks, now_s=100.0)  # not there yet
    assert waits.load_timeout_s("r", 0.5, now_s=100.0) == 0.5  # nothing came yet
    assert not waits.waiting("r", params, NS, blocks, blocks, now_s=100.0 + waited_s)
    now = 100.0 + waited_s + loaded_after_s
    assert waits.load_timeout_s("r", 0.5, now_s=now) == max(0.5, 105.0 - now)
    waits.forget("r")
    assert waits.load_timeout_s("r", 0.5, now_s=now) == 0.5


def test_other_loads_and_commits_have_one_calls_deadline() -> None:
    waits = ConsumerWaits(timeout_s=60.0)
    assert not waits.waiting("plain", None, NS, 0, 4, now_s=1.0)
    assert waits.load_timeout_s("plain", 5.0, now_s=1.0) == 5.0
    assert commit_timeout_s(None, 5.0, 60.0) == 5.0
    assert commit_timeout_s({"do_remote_prefill": True}, 5.0, 60.0) == 5.0
    assert commit_timeout_s({"do_remote_decode": True}, 5.0, 60.0) == 60.0
    assert commit_timeout_s({"do_remote_decode": True}, 5.0, 2.0) == 5.0
