"""What a server needs of the engine: per-request scopes (tenant, cache salt), aborts, and
a replay mode that caches prompt blocks only; on the fake model with a real DRAM store."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from engine.connector.store_link import KVStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import SequenceStatus
from engine.kv.namespace import engine_namespace
from engine.kv.request_scope import IDENTITY, RequestScope
from kvstore.keys import chain_keys
from tests.conftest import small_ns
from tests.engine.engine_harness import BT, GREEDY, WrappedStore, dram_store, fake_engine
from tests.engine.fake_model import FakeModel, fake_spec, greedy_continuation


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 13 + i * 5) % 90 + 1 for i in range(n)]


def run(eng, ids, scope=IDENTITY, params=GREEDY):  # type: ignore[no-untyped-def]
    seq = eng.add_request(ids, params, scope)
    while not seq.is_finished:
        eng.step()
        eng.check_integrity()
    return seq


def test_identity_scope_keeps_the_namespace() -> None:
    ns = small_ns(tenant="t")
    assert IDENTITY.apply(ns) is ns
    assert RequestScope(cache_salt="").apply(ns) is ns


@given(st.text(max_size=8), st.text(max_size=8), st.text(min_size=41, max_size=60))
def test_scopes_give_distinct_namespaces(a: str, b: str, salt: str) -> None:
    ns = small_ns()
    if a != b:
        assert RequestScope(a).apply(ns).fingerprint != RequestScope(b).apply(ns).fingerprint
    salted = RequestScope(a, salt).apply(ns)
    assert salted.tenant == a and salted.fingerprint != RequestScope(a).apply(ns).fingerprint
    assert salt not in salted.model_revision  # only its digest (32 hex) reaches the store


def test_tenants_never_share_hits_in_pool_or_store() -> None:
    store = WrappedStore(dram_store())
    p = prompt(6 * BT)
    with fake_engine(store) as eng:
        first = run(eng, p, RequestScope("alice"))
        eng.drain(10)
        same = run(eng, p, RequestScope("alice"))
        other = run(eng, p, RequestScope("bob"))
        salted = run(eng, p, RequestScope("alice", cache_salt="s1"))
    assert first.stats.computed_tokens == len(p)
    assert sum(same.stats.hit_tokens.values()) == 5 * BT
    for seq in (other, salted):
        assert sum(seq.stats.hit_tokens.values()) == 0 and seq.stats.computed_tokens == len(p)
        assert seq.output_ids == first.output_ids == greedy_continuation(p, 6)


def test_a_tenant_hits_its_blocks_in_the_store_under_its_namespace() -> None:
    store = WrappedStore(dram_store())
    p = prompt(6 * BT)
    scope = RequestScope("alice")
    with fake_engine(store) as eng:
        run(eng, p, scope)
        eng.drain(10)
        ns = scope.apply(eng.ns)
    # The blocks went to the store under alice's namespace, not the engine's own.
    assert store.lookup(ns, chain_keys(ns, p)).hit_blocks == 6
    assert store.lookup(eng.ns, chain_keys(eng.ns, p)).hit_blocks == 0
    # A fresh engine (empty pool) finds alice's prefix in the store, bob's nothing.
    with fake_engine(store) as eng2:
        again = run(eng2, p, scope)
        bob = run(eng2, p, RequestScope("bob"))
    assert again.stats.hit_tokens["dram"] == 5 * BT
    assert bob.stats.hit_tokens == {"hbm": 0, "dram": 0, "ssd": 0}
    assert again.stats.store_lookup_s > 0 and again.stats.admitted_s is not None


def test_abort_frees_blocks_at_every_stage() -> None:
    params = SamplingParams(max_new_tokens=50)
    store = WrappedStore(dram_store())
    with fake_engine(store, pool_blocks=40, budget=8, max_seqs=1) as eng:
        free0 = eng.blocks.num_free
        running = eng.add_request(prompt(20, 1), params)
        waiting = eng.add_request(prompt(20, 2), params)
        for _ in range(5):
            eng.step()
        assert running.status is SequenceStatus.RUNNING
        assert waiting.status is SequenceStatus.WAITING
        eng.abort(waiting)
        eng.abort(running)
        eng.check_integrity()
        assert running.finish_reason == waiting.finish_reason == "abort"
        assert not eng.has_unfinished
        eng.drain(10)
        eng.scheduler.poll()
        # Only cached (free, reusable) blocks remain: nothing is held.
        assert eng.blocks.num_free == free0
        # A request stuck loading from a slow store is aborted too.
        run(eng, prompt(12, 3))
        eng.drain(10)
    store.get_delay_s = 0.5
    with fake_engine(store, pool_blocks=40) as eng:
        free0 = eng.blocks.num_free
        seq = eng.add_request(prompt(12, 3), GREEDY)
        eng.step()
        assert seq.status is SequenceStatus.LOADING
        eng.abort(seq)
        eng.check_integrity()
        deadline = time.monotonic() + 5
        while eng.blocks.num_free != free0 and time.monotonic() < deadline:
            eng.step()
        assert eng.blocks.num_free == free0 and not eng.has_unfinished
        eng.abort(seq)  # idempotent


def test_generated_tokens_stay_out_of_the_caches_when_asked() -> None:
    p = prompt(5 * BT + 2)  # 5 full prompt blocks; the answer completes a 6th and 7th
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    counts = {}
    for cache_generated in (True, False):
        store = WrappedStore(dram_store())
        model = FakeModel(fake_spec())
        ns = engine_namespace(model.spec, BT)
        config = EngineConfig(pool_tokens=64 * BT, block_tokens=BT, max_batched_tokens=16,
                              attention_backend="torch", cache_generated_tokens=cache_generated)
        with LLMEngine(model, config, KVStoreLink(store, ns, "test")) as eng:
            seq = run(eng, p, params=params)
            eng.drain(10)
            keys = chain_keys(eng.ns, seq.token_ids)
            counts[cache_generated] = (eng.blocks.longest_prefix(keys, len(seq.token_ids) + 1),
                                       store.lookup(eng.ns, keys).hit_blocks)
    assert len(counts[True][0]) == counts[True][1] == 7
    assert len(counts[False][0]) == counts[False][1] == 5
