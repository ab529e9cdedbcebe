"""The scheduler side's arithmetic: usable hits, failed blocks, what a step saves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clients.vllm_connector.plan import LoadJob, RequestState, usable_hit_tokens
from kvstore.keys import Namespace

NS = Namespace("LlamaForCausalLM", "r", "float32", "mha", (0,), 1, 8)


def test_a_hit_is_cut_to_vllm_blocks_and_leaves_the_last_token() -> None:
    assert usable_hit_tokens(64, 64, 4196, 128) == 4096
    assert usable_hit_tokens(3, 64, 10_000, 128) == 128  # 192 tokens -> one 128-token block
    assert usable_hit_tokens(4, 64, 256, 128) == 128  # all 256 hit, one must be computed
    assert usable_hit_tokens(0, 64, 256, 16) == 0


@given(st.integers(0, 200), st.sampled_from([16, 32, 64, 128, 256]), st.integers(1, 20_000),
       st.sampled_from([16, 32, 64, 128]))
def test_usable_hit_bounds(hit: int, block: int, prompt: int, vllm_block: int) -> None:
    n = usable_hit_tokens(hit, block, prompt, vllm_block)
    assert n % vllm_block == 0 and 0 <= n <= min(hit * block, prompt - 1)
    assert min(hit * block, prompt - 1) - n < vllm_block


def test_failed_blocks_are_the_vllm_blocks_from_the_first_missing_token() -> None:
    job = LoadJob("r", NS, (b"k" * 16,) * 4, first_block=0, start=0, end=512,
                  block_ids=(7, 3, 9, 4, 11), timeout_s=5.0)
    assert job.failed_block_ids(512, 128) == set()
    assert job.failed_block_ids(320, 128) == {9, 4}  # token 320 sits in block 2 (256..383)
    assert job.failed_block_ids(0, 128) == {7, 3, 9, 4}


def test_a_step_saves_the_full_blocks_it_completed_once() -> None:
    state = RequestState(ns=NS, keys=[], stored_blocks=2, hit_blocks=2)
    assert state.save_range(100, 64) is None  # the store has blocks 0, 1
    assert state.save_range(300, 64) == (2, 4)
