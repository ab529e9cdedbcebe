"""The prefill/decode hand-off hooks (``engine.connector.handoff``) on engines over the stand-in
model and a real DRAM store: a receipt returns once a request's commit is over and not
before; the store then serves the prompt's full blocks; a decode engine waiting for blocks
that never come returns at its timeout with what the store holds; a receipt's bookkeeping
holds under any order of its calls."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.connector.handoff import CommitReceipt
from engine.core.sampling_params import SamplingParams
from engine.errors import EngineIntegrityError
from tests.engine.engine_harness import BT, WrappedStore, dram_store, fake_engine

ONE = SamplingParams(max_new_tokens=1)


def run(eng, seq) -> None:  # type: ignore[no-untyped-def]
    while not seq.is_finished:
        eng.step()


def test_the_receipt_waits_for_the_commit_then_the_store_serves_the_prompt(
        store: WrappedStore) -> None:
    prompt = list(range(10, 10 + 5 * BT + 2))  # 5 full blocks and a partial one
    with fake_engine(store) as eng:
        store.commit_gate.clear()  # the store holds the commit
        receipt = CommitReceipt()
        seq = eng.add_request(prompt, ONE, commit_receipt=receipt)
        eng.step()
        eng.check_integrity()  # an unfinished request's receipt is not done
        run(eng, seq)
        assert not receipt.wait(0.2)  # finished, but its commit is not over
        assert eng.visible_prompt_blocks(prompt) == 0
        store.commit_gate.set()
        assert receipt.wait(10)
        assert receipt.jobs == 1 and receipt.failed == 0
        assert eng.visible_prompt_blocks(prompt) == 5
        eng.check_integrity()


def test_a_failed_commit_is_over_too_and_the_store_says_what_it_holds(
        store: WrappedStore) -> None:
    prompt = list(range(10, 10 + 3 * BT))
    with fake_engine(store) as eng:
        store.commit_error = RuntimeError("test: commit fails")
        receipt = CommitReceipt()
        run(eng, eng.add_request(prompt, ONE, commit_receipt=receipt))
        assert receipt.wait(10)
        assert receipt.failed == 1
        assert eng.visible_prompt_blocks(prompt) == 0


def test_an_aborted_waiting_request_seals_its_receipt() -> None:
    with fake_engine(dram_store()) as eng:
        receipt = CommitReceipt()
        seq = eng.add_request(list(range(10, 30)), ONE, commit_receipt=receipt)
        eng.abort(seq)  # never admitted: nothing to commit
        assert receipt.wait(0) and receipt.jobs == 0


def test_a_decode_engine_waits_for_blocks_another_engine_commits() -> None:
    shared = dram_store(16 << 20)
    prompt = list(range(20, 20 + 4 * BT + 1))
    with fake_engine(shared) as prefill, fake_engine(shared) as decode:
        seen: list[int] = []
        waiter = threading.Thread(
            target=lambda: seen.append(decode.wait_prompt_blocks(prompt, 4, 30.0)))
        waiter.start()
        time.sleep(0.1)  # the decode side is waiting before anything was committed
        receipt = CommitReceipt()
        run(prefill, prefill.add_request(prompt, ONE, commit_receipt=receipt))
        assert receipt.wait(10)
        waiter.join(30)
        assert seen == [4]
        # The decode engine now computes only the last block's worth of the prompt.
        seq = decode.add_request(prompt, SamplingParams(max_new_tokens=2))
        run(decode, seq)
        assert seq.stats.computed_tokens <= BT
        assert seq.stats.hit_tokens["dram"] == 4 * BT


def test_blocks_that_never_come_end_the_wait_at_its_timeout() -> None:
    with fake_engine(dram_store()) as eng:
        start = time.monotonic()
        assert eng.wait_prompt_blocks(list(range(10, 10 + 3 * BT)), 3, 0.3) == 0
        assert time.monotonic() - start < 10  # bounded (0.3 s asked, slack for load)


def test_without_a_store_there_is_nothing_to_wait_for() -> None:
    with fake_engine(None) as eng:
        start = time.monotonic()
        assert eng.wait_prompt_blocks(list(range(10, 10 + 3 * BT)), 3, 60.0) == 0
        assert time.monotonic() - start < 30  # at once, not at the 60 s timeout


def test_a_dead_store_is_zero_blocks_not_an_error(store: WrappedStore) -> None:
    with fake_engine(store) as eng:
        store.dead = True
        assert eng.visible_prompt_blocks(list(range(10, 10 + 2 * BT))) == 0
        assert eng.wait_prompt_blocks(list(range(10, 10 + 2 * BT)), 2, 0.1) == 0


@given(st.lists(st.sampled_from(["expect", "report_ok", "report_bad", "seal"]),
                max_size=30))
def test_receipt_bookkeeping(ops: list[str]) -> None:
    r = CommitReceipt()
    called: list[int] = []
    r.add_done_callback(lambda: called.append(1))  # once, when it becomes done
    pending = jobs = failed = 0
    sealed = False
    for op in ops:
        if op == "expect":
            if sealed:
                with pytest.raises(EngineIntegrityError):
                    r.expect()
                continue
            r.expect()
            pending += 1
            jobs += 1
        elif op.startswith("report"):
            if pending == 0:
                with pytest.raises(EngineIntegrityError):
                    r.report(True)
                continue
            r.report(op == "report_ok")
            pending -= 1
            failed += op == "report_bad"
        else:
            r.seal()
            sealed = True
        r.check_integrity()
        assert (r.jobs, r.failed) == (jobs, failed)
        assert r.done == (sealed and pending == 0) == r.wait(0)
        assert called == ([1] if r.done else [])


def test_a_callback_added_once_done_runs_at_once() -> None:
    r = CommitReceipt()
    r.seal()
    called: list[int] = []
    r.add_done_callback(lambda: called.append(1))
    assert called == [1]


def test_a_hybrid_model_hands_off_both_namespaces() -> None:
    """Exact mode for a hybrid model commits the sliding layers to a namespace of their
    own: the receipt waits for every commit (with the hybrid pool, the sliding rows of the
    blocks that left the window went in a commit of their own before the request ended),
    and the decode engine loads both."""
    shared = dram_store(16 << 20)
    prompt = list(range(30, 30 + 6 * BT + 3))
    hybrid = {"windows": (2 * BT, None), "cache_all_layers": True}
    with fake_engine(shared, **hybrid) as prefill, fake_engine(shared, **hybrid) as decode:
        assert prefill.sliding_link is not None
        receipt = CommitReceipt()
        run(prefill, prefill.add_request(prompt, ONE, commit_receipt=receipt))
        assert receipt.wait(10) and receipt.jobs == 3 and receipt.failed == 0
        assert decode.wait_prompt_blocks(prompt, 6, 10.0) == 6
        seq = decode.add_request(prompt, SamplingParams(max_new_tokens=2))
        run(decode, seq)
        assert seq.stats.computed_tokens <= BT
        assert seq.stats.hit_tokens["dram"] == 6 * BT
