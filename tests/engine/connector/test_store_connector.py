"""The store connector's four calls, driven by hand on a real (fake-model) engine and a
real DRAM store: match, start_load, poll, on_finish; and a load given up on."""

from __future__ import annotations

import time

from engine.connector.store_connector import LoadNeed, LoadOutcome
from engine.core.sequence import Sequence
from tests.engine.engine_harness import BT, GREEDY, WrappedStore, fake_engine, run_checked


def test_without_a_store_nothing_is_asked() -> None:
    with fake_engine() as eng:
        seq = Sequence(list(range(1, 4 * BT)), GREEDY)
        assert not eng.connector.enabled
        assert eng.connector.match(seq, eng.kv.match(seq)) is None


def _filled(store: WrappedStore, prompt: list[int]) -> None:
    with fake_engine(store) as first:
        run_checked(first, [prompt])


def test_a_load_is_matched_started_landed_and_its_request_committed(
    store: WrappedStore,
) -> None:
    p = list(range(1, 6 * BT + 2))
    _filled(store, p)
    with fake_engine(store) as eng:
        seq = Sequence(list(p), GREEDY)
        hit = eng.kv.match(seq)
        need = eng.connector.match(seq, hit)
        assert need == LoadNeed(load_blocks=6, reserve_blocks=0)  # exact mode: no reserve
        free = eng.kv.num_free
        eng.connector.start_load(seq, hit, need)
        assert eng.kv.num_free == free - need.blocks
        assert eng.connector.loading_ids == {seq.seq_id}
        outcomes: list[LoadOutcome] = []
        assert eng.loader.wait_idle(10)
        eng.connector.poll(outcomes.append)
        (out,) = outcomes
        assert out.seq is seq and out.pool_blocks == 0 and not out.gave_up
        assert out.tiers == ("dram",) * 6 and len(out.has_sliding) == 6
        assert len(eng.kv.table(seq)) == 6 and not eng.connector.loading_ids
        # The table's blocks are indexed under the request's keys and known to be stored.
        assert [b.key for b in eng.kv.table(seq)] == eng.kv.keys(seq)[:6]
        assert all(b.stored_layers for b in eng.kv.table(seq))
        seq.plan = eng.kv.plan(seq, out.has_sliding)
        eng.kv.start_replay(seq, seq.plan, out.pool_blocks)
        seq.num_computed_tokens = 6 * BT
        # Nothing new to send: the primary chain still goes (it refreshes recency).
        sent = len(store.commits)
        eng.connector.on_finish(seq)
        eng.kv.free(seq)
        assert eng.connector.drain(10)
        assert store.commits[sent:] == [{}]
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free


def test_an_aborted_load_releases_its_blocks_when_the_loader_reports(
    store: WrappedStore,
) -> None:
    p = list(range(1, 6 * BT + 2))
    _filled(store, p)
    with fake_engine(store) as eng:
        store.get_gate.clear()  # the loader is still copying when the request goes
        seq = Sequence(list(p), GREEDY)
        hit = eng.kv.match(seq)
        need = eng.connector.match(seq, hit)
        assert need is not None
        eng.connector.start_load(seq, hit, need)
        eng.connector.abort_load(seq)
        eng.kv.free(seq)
        outcomes: list[LoadOutcome] = []
        eng.connector.poll(outcomes.append)
        assert eng.kv.num_free < eng.kv.num_blocks  # the job still holds its blocks
        store.get_gate.set()
        deadline = time.monotonic() + 10
        while eng.kv.num_free < eng.kv.num_blocks and time.monotonic() < deadline:
            eng.connector.poll(outcomes.append)
            time.sleep(0.01)
        assert not outcomes and eng.kv.num_free == eng.kv.num_blocks
        eng.check_integrity()
