"""The connector's side of the PD hand-off (``clients.vllm_connector.handoff``), without
vLLM: what a producer answers, and when a consumer's request waits for its producer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clients.vllm_connector.handoff import ConsumerWaits, prefill_params, remote_prefill
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
