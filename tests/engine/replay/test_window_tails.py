"""Bounded mode's window tails: at each committed sequence end the store also gets the
sliding layers of the blocks its last window reaches, so the next turn of a session, which
hits exactly there, loads them and replays nothing; any other hit replays as before.

On a random ``tiny`` Gemma 3 (``kvengine make-model``: layer 0 slides over 128 tokens,
layer 1 is full; blocks of 16 tokens, so a tail is ceil(127 / 16) = 8 blocks) under
``--deterministic``: a tail hit's logits are bitwise an exact-mode hit's (and a cold
prefill's) when the prefix was computed cold. Real stores: the embedded one, and a
``kvstore serve`` daemon on 127.0.0.1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.connector.stores import StoreOptions, open_store_link
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.kv.namespace import engine_namespace, engine_namespaces
from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model
from kvstore.embedded import open_embedded
from kvstore.keys import chain_keys
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.tier import KVStore
from tests.engine.replay.harness import BT, Run, config, engine, request, tokens

KEEP = 128 + 12
END = 20  # blocks of the first turn's committed end (its prompt: 325 tokens)
TAIL = range(12, END)  # (20 · 16 − 127) // 16 = 12: the blocks the next token sees


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_model("gemma3", "tiny", tmp_path_factory.mktemp("models") / "g3",
                      hybrid=True).path
    return load_model(path, dtype="bfloat16",
                      revision_cache_dir=tmp_path_factory.mktemp("revisions"))


def det(cfg: EngineConfig) -> EngineConfig:
    return replace(cfg, deterministic=True, attention_backend=None)


BOUNDED, EXACT = det(config(KEEP)), det(config(exact=True))


def prompts(lm: LoadedModel) -> tuple[list[int], list[int]]:
    """Turn 1 (cold) and turn 2, which extends it: its hit is turn 1's committed end."""
    first = tokens(END * BT + 5, 1, lm.spec.vocab_size)
    return first, first + tokens(60, 2, lm.spec.vocab_size)


def turn(lm: LoadedModel, cfg: EngineConfig, store: KVStore, prompt: list[int],
         new: int = 1) -> tuple[Run, dict[str, int], dict[str, int]]:
    """One request in a fresh engine (an empty pool); the committed blocks of its primary
    and its sliding namespace."""
    with engine(lm, cfg, store) as eng:
        run = request(eng, prompt, new)
        eng.drain()
        assert eng.sliding_link is not None
        return run, eng.link.counters(), eng.sliding_link.counters()


@pytest.mark.parametrize("hybrid_pool", [True, False], ids=["hybrid-pool", "one-group-pool"])
def test_a_tail_hit_replays_nothing_and_is_bitwise_an_exact_hit(gemma: LoadedModel,
                                                                hybrid_pool: bool) -> None:
    """In a hybrid pool the loaded tail lands in companion pages the engine thread gives;
    in a one-group pool the loader writes it into the hit's blocks."""
    first, second = prompts(gemma)
    runs = {}
    for name, cfg in (("bounded", BOUNDED), ("exact", EXACT)):
        cfg = replace(cfg, hybrid_pool=hybrid_pool)
        store = open_embedded(dram_bytes=64 << 20)
        try:
            cold, primary, sliding = turn(gemma, cfg, store, first)
            assert cold.seq.stats.replayed_tokens == 0 and primary["committed_blocks_total"] == END
            # Bounded: the tail's 8 blocks only; exact: every block's sliding layers.
            want = len(TAIL) if name == "bounded" else END
            assert sliding["committed_blocks_total"] == want
            runs[name], _, _ = turn(gemma, cfg, store, second)
        finally:
            store.close()
    hit = runs["bounded"].seq.stats
    assert hit.hit_tokens == {"hbm": 0, "dram": END * BT, "ssd": 0}
    assert hit.replayed_tokens == 0 and hit.computed_tokens == len(second) - END * BT
    assert torch.equal(runs["bounded"].logits, runs["exact"].logits)
    with engine(gemma, replace(EXACT, hybrid_pool=hybrid_pool)) as eng:  # and a cold one's
        assert torch.equal(request(eng, second, 1).logits, runs["exact"].logits)


def test_a_hit_elsewhere_replays_and_its_tail_serves_the_next_turn(
        gemma: LoadedModel) -> None:
    """A hit at 17 blocks (turn 1 committed 20) has no tail: it replays, not shortened.
    Its own end (19 blocks) gets a tail, partly of blocks its replay rewrote (9..16: from
    ceil((272 − 140) / 16) on), so the turn after it replays nothing."""
    first, _ = prompts(gemma)
    vocab = gemma.spec.vocab_size
    third = first[: 17 * BT] + tokens(40, 3, vocab)  # 312 tokens: its end is 19 blocks
    store = open_embedded(dram_bytes=64 << 20)
    try:
        turn(gemma, BOUNDED, store, first)
        run, _, sliding = turn(gemma, BOUNDED, store, third)
        assert run.seq.stats.hit_tokens["dram"] == 17 * BT
        assert run.seq.stats.replayed_tokens == KEEP
        # Its tail [11, 19): 12..16 the store holds already (turn 1's), 11, 17, 18 new.
        assert sliding["committed_blocks_total"] == 3
        fourth = third + tokens(30, 4, vocab)
        nxt, _, _ = turn(gemma, BOUNDED, store, fourth)
        assert nxt.seq.stats.hit_tokens["dram"] == 19 * BT
        assert nxt.seq.stats.replayed_tokens == 0
    finally:
        store.close()


def test_an_answer_spanning_blocks_commits_the_tails_of_both_ends(gemma: LoadedModel) -> None:
    first, _ = prompts(gemma)
    store = open_embedded(dram_bytes=64 << 20)
    try:
        # 325 + 39 computed tokens: ends at 20 blocks (the prompt) and 22 (the answer).
        run, primary, sliding = turn(gemma, BOUNDED, store, first, new=40)
        assert primary["committed_blocks_total"] == 22
        assert sliding["committed_blocks_total"] == len(range(12, 22))  # [12,20) ∪ [14,22)
        nxt, _, _ = turn(gemma, BOUNDED, store, first + run.seq.output_ids[:-1] + [7, 8])
        assert nxt.seq.stats.hit_tokens["dram"] == 22 * BT
        assert nxt.seq.stats.replayed_tokens == 0
    finally:
        store.close()


def test_a_store_missing_a_tail_block_replays(gemma: LoadedModel) -> None:
    """The store holds turn 1's blocks and its tail but one block (copied over from a store
    that has it all): the hit stays whole and replays ``keep`` tokens."""
    first, second = prompts(gemma)
    ns = engine_namespaces(gemma.spec, BT, BOUNDED.replay_policy(gemma.spec.layer_windows))
    assert ns.sliding is not None
    full, holed = open_embedded(dram_bytes=64 << 20), open_embedded(dram_bytes=64 << 20)
    try:
        turn(gemma, BOUNDED, full, first)
        for space, blocks, hole in ((ns.primary, range(END), -1), (ns.sliding, TAIL, 15)):
            keys = chain_keys(space, first[: END * BT])
            rows = torch.empty((len(blocks), *space.payload_shape), dtype=gemma.spec.dtype)
            assert full.get_into(space, keys[blocks.start:], rows) == len(blocks)
            holed.register(space)
            holed.commit(space, keys, {i: rows[i - blocks.start] for i in blocks if i != hole})
        run, _, _ = turn(gemma, BOUNDED, holed, second)
        assert run.seq.stats.hit_tokens["dram"] == END * BT  # never shortened
        assert run.seq.stats.replayed_tokens == KEEP
        assert run.seq.stats.computed_tokens == len(second) - END * BT + KEEP
    finally:
        full.close()
        holed.close()


def test_a_daemon_store_round_trips_the_tail(gemma: LoadedModel, tmp_path: Path) -> None:
    """``kvstore serve`` on 127.0.0.1: turn 1's tail goes over gRPC, a second engine
    (its own connection, an empty pool) hits it and replays nothing, with the logits of
    the embedded store's run."""
    first, second = prompts(gemma)
    policy = BOUNDED.replay_policy(gemma.spec.layer_windows)

    def link_for(url: str):  # type: ignore[no-untyped-def]
        return open_store_link(url, lambda tenant: engine_namespace(gemma.spec, BT, tenant,
                                                                    policy), StoreOptions())

    with DaemonProcess(["--dram", "64MiB"]) as daemon:
        with LLMEngine(gemma.model, BOUNDED, link_for(daemon.url)) as eng:
            request(eng, first, 1)
            eng.drain()
            assert eng.sliding_link is not None
            assert eng.sliding_link.counters()["committed_blocks_total"] == len(TAIL)
        with LLMEngine(gemma.model, BOUNDED, link_for(daemon.url)) as eng:
            run = request(eng, second, 1)
            assert eng.link.counters()["store_errors_total"] == 0
    assert run.seq.stats.hit_tokens["dram"] == END * BT
    assert run.seq.stats.replayed_tokens == 0
    store = open_embedded(dram_bytes=64 << 20)
    try:
        turn(gemma, BOUNDED, store, first)
        embedded, _, _ = turn(gemma, BOUNDED, store, second)
    finally:
        store.close()
    assert torch.equal(run.logits, embedded.logits)
