"""The same multi-turn agent session with every kind of prefix caching agrees with a run
without any: pool hits (``none``), the embedded store (DRAM, then SSD in a fresh store), a
real ``kvstore serve`` over gRPC, and a daemon killed mid-session. Tiny model, float32;
tokens compared with the near-tie rule and logits within tolerance."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.connector.store_link import KVStoreLink, StoreLink
from engine.connector.stores import StoreOptions, open_store_link
from engine.core.llm_engine import LLMEngine
from engine.entrypoints.generate import TurnResult
from engine.entrypoints.session import Conversation
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from kvstore.keys import chain_keys
from kvstore.testing.daemon_process import DaemonProcess
from storage_nodes.ssd.config import payload_offset_for
from tests.engine.engine_harness import WrappedStore
from tests.engine.sessions import (
    Recorded,
    agent_session,
    assert_same_session,
    engine_for,
    play_recorded,
    play_uncached,
)

TURNS = agent_session()
BLOCK = 64  # the engines here run 64-token blocks


@pytest.fixture(scope="module")
def reference(tiny: LoadedModel) -> Recorded:
    return play_uncached(tiny, TURNS)


def hits(rec: Recorded, tier: str) -> int:
    return sum(t.hit_tokens[tier] for t in rec.turns)


def shared_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def whole_cache_hits(lm: LoadedModel, rec: Recorded) -> list[int]:
    """Per turn, the hit of a cache that kept every block computed before it: the longest
    prefix the turn's prompt shares with an earlier turn's computed tokens (its prompt and
    answer, less the last answer token, whose K/V is never computed), in whole blocks,
    short of the prompt's last token (computed for the first new token's logits)."""
    conversations: dict[str, Conversation] = {}
    computed: list[list[int]] = []
    out = []
    for turn, r in zip(TURNS, rec.turns, strict=True):
        conv = conversations.setdefault(
            turn.session, Conversation(lm.tokenizer, lm.spec.eos_token_ids))
        ids = conv.next_prompt(turn.user)
        assert len(ids) == r.prompt_tokens
        common = max((shared_prefix(ids, c) for c in computed), default=0)
        out.append(min(common, len(ids) - 1) // BLOCK * BLOCK)
        conv.record_answer(r.token_ids)
        computed.append((ids + r.token_ids)[:-1])
    return out


def all_but_the_last_token(rec: Recorded) -> list[int]:
    """Per turn, the whole blocks of its prompt short of the last token: the hit when the
    cache holds the prompt (a store that kept an identical earlier run)."""
    return [(t.prompt_tokens - 1) // BLOCK * BLOCK for t in rec.turns]


def settle(eng: LLMEngine) -> Callable[[int, TurnResult], None]:
    """An ``on_turn`` hook: the turn's commit (on the committer's thread, after the turn
    ended) lands before the next turn asks the store, which would otherwise race it."""
    def wait(i: int, _: TurnResult) -> None:
        assert eng.committer.wait_idle(60), f"turn {i}: its commit did not land"
    return wait


def check_accounting(turns: list[TurnResult]) -> None:
    for t in turns:
        assert sum(t.hit_tokens.values()) + t.computed_tokens == t.prompt_tokens


STORE = StoreOptions(dram_bytes=64 << 20, ssd_capacity_bytes=256 << 20)


def link_for(lm: LoadedModel, url: str) -> StoreLink:
    return open_store_link(url, lambda tenant: engine_namespace(lm.spec, 64, tenant), STORE)


def test_reference_computes_everything(reference: Recorded) -> None:
    assert all(t.computed_tokens == t.prompt_tokens for t in reference.turns)
    assert len({t.prompt_tokens for t in reference.turns}) == len(TURNS)


def test_pool_hits_agree_with_no_caching(tiny: LoadedModel, reference: Recorded) -> None:
    with engine_for(tiny) as eng:
        rec = play_recorded(eng, tiny, TURNS)
        evicted = eng.hbm_stats().counters["evicted_blocks_total"]
    assert assert_same_session(rec, reference, "none") == len(TURNS)
    whole = whole_cache_hits(tiny, rec)
    got = [t.hit_tokens["hbm"] for t in rec.turns]
    # Until the pool (13 blocks) fills, it serves all a whole cache would: the first turn
    # nothing, the second the header the first computed. Past that, which blocks it kept
    # depends on its eviction order (not modelled here): bounded by the whole cache's
    # hits, and short of them in total, as the pool is smaller than the session.
    assert got[:2] == whole[:2] and whole[1] > 0
    assert all(g <= w for g, w in zip(got, whole, strict=True)), (got, whole)
    assert sum(got) < sum(whole) and evicted > 0
    check_accounting(rec.turns)


def test_embedded_store_agrees_in_this_and_a_fresh_store(
    tiny: LoadedModel, reference: Recorded, tmp_path: Path
) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    with engine_for(tiny, link_for(tiny, url)) as eng:
        first = play_recorded(eng, tiny, TURNS, on_turn=settle(eng))
    assert assert_same_session(first, reference, "embedded") == len(TURNS)
    # The pool and the store together keep every block (64 MiB of DRAM holds the session):
    # each turn hits what a whole cache would, the store serving what the pool evicted.
    assert [sum(t.hit_tokens.values()) for t in first.turns] == whole_cache_hits(tiny, first)
    assert hits(first, "ssd") == 0
    assert hits(first, "dram") > 0  # the other agent evicted this one's blocks from the pool
    # A fresh store on the same directory: its DRAM is empty, the SSD has everything.
    with engine_for(tiny, link_for(tiny, url)) as eng:
        second = play_recorded(eng, tiny, TURNS, on_turn=settle(eng))
        assert eng.link.counters()["store_errors_total"] == 0
    assert assert_same_session(second, reference, "embedded, fresh store") == len(TURNS)
    full = all_but_the_last_token(second)
    assert [sum(t.hit_tokens.values()) for t in second.turns] == full
    assert second.turns[0].hit_tokens == {"hbm": 0, "dram": 0, "ssd": full[0]}
    check_accounting(first.turns + second.turns)


def test_grpc_daemon_agrees(tiny: LoadedModel, reference: Recorded) -> None:
    with DaemonProcess(["--dram", "64MiB"]) as daemon:
        with engine_for(tiny, link_for(tiny, daemon.url)) as eng:
            first = play_recorded(eng, tiny, TURNS, on_turn=settle(eng))
        with engine_for(tiny, link_for(tiny, daemon.url)) as eng:
            second = play_recorded(eng, tiny, TURNS, on_turn=settle(eng))
            assert eng.link.counters()["store_errors_total"] == 0
    assert assert_same_session(first, reference, "grpc") == len(TURNS)
    assert assert_same_session(second, reference, "grpc, second engine") == len(TURNS)
    # A DRAM-only daemon that keeps everything: the first engine hits what a whole cache
    # would; the second, with an empty pool, every block of every prompt.
    assert [sum(t.hit_tokens.values()) for t in first.turns] == whole_cache_hits(tiny, first)
    assert [sum(t.hit_tokens.values()) for t in second.turns] == all_but_the_last_token(second)
    assert hits(first, "ssd") == hits(second, "ssd") == 0
    assert second.turns[0].hit_tokens["dram"] == all_but_the_last_token(second)[0]
    assert hits(second, "dram") > hits(first, "dram") > 0
    check_accounting(first.turns + second.turns)


def test_daemon_killed_mid_session_costs_misses_not_errors(
    tiny: LoadedModel, reference: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = DaemonProcess(["--dram", "64MiB"])
    try:
        with engine_for(tiny, link_for(tiny, daemon.url)) as eng:

            def kill_after_second_turn(i: int, _: TurnResult) -> None:
                if i == 1:
                    daemon.kill()

            rec = play_recorded(eng, tiny, TURNS, on_turn=kill_after_second_turn)
            failed = eng.link.counters()["store_errors_total"]
    finally:
        daemon.stop()
    assert assert_same_session(rec, reference, "grpc, daemon killed") == len(TURNS)
    assert failed > 0
    late = rec.turns[2:]
    assert sum(t.hit_tokens["dram"] + t.hit_tokens["ssd"] for t in late) == 0
    assert sum(t.hit_tokens["hbm"] for t in late) > 0  # the pool still serves what it holds
    warnings = [r for r in caplog.records if r.name == "engine.store"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once, not once per call
    check_accounting(rec.turns)


def test_get_into_returning_fewer_blocks_than_lookup_agrees(
    tiny: LoadedModel, reference: Recorded
) -> None:
    """The store's ``get_into`` copies one block however many ``lookup`` promised: each
    turn admits only the copied block and computes the rest."""
    inner = open_embedded(dram_bytes=64 << 20)
    store = WrappedStore(inner)
    ns = engine_namespace(tiny.spec, 64)
    try:
        with engine_for(tiny, KVStoreLink(store, ns, "test")) as eng:
            play_recorded(eng, tiny, TURNS)
        first_prompt = Conversation(tiny.tokenizer).next_prompt(TURNS[0].user)
        promised = inner.lookup(ns, chain_keys(ns, first_prompt)).hit_blocks
        # The first turn computed and committed every whole block of its prompt (closing
        # the engine waited for its commits).
        assert promised == len(first_prompt) // BLOCK >= 3
        store.short_get = 1
        with engine_for(tiny, KVStoreLink(store, ns, "test")) as eng:
            rec = play_recorded(eng, tiny, TURNS)
    finally:
        inner.close()
    assert assert_same_session(rec, reference, "short get_into") == len(TURNS)
    first = rec.turns[0]
    assert first.hit_tokens == {"hbm": 0, "dram": 64, "ssd": 0}
    assert first.computed_tokens == first.prompt_tokens - 64
    assert all(t.hit_tokens["dram"] <= 64 for t in rec.turns)
    check_accounting(rec.turns)


def _flip_payload_byte(ssd_dir: Path, key: bytes) -> None:
    """Flip one payload byte of the stored block ``key`` (found by its header, DESIGN §4;
    the payload's place in the slot by its length, ``payload_offset_for``)."""
    for path in sorted(ssd_dir.rglob("slab-*")):
        data = path.read_bytes()
        for off in range(0, len(data) - 64, 4096):
            if data[off : off + 4] == b"KVB1" and data[off + 24 : off + 40] == key:
                plen = int.from_bytes(data[off + 40 : off + 48], "little")
                at = off + payload_offset_for(plen) + 1000
                with path.open("r+b") as f:
                    f.seek(at)
                    byte = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([byte ^ 0x10]))
                return
    raise AssertionError("block not found in any slab")


def test_a_corrupt_block_is_a_miss(tiny: LoadedModel, reference: Recorded,
                                   tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    with engine_for(tiny, link_for(tiny, url)) as eng:
        play_recorded(eng, tiny, TURNS)
    ns = engine_namespace(tiny.spec, 64)
    first_prompt = Conversation(tiny.tokenizer).next_prompt(TURNS[0].user)
    _flip_payload_byte(tmp_path / "store", chain_keys(ns, first_prompt)[3])
    with engine_for(tiny, link_for(tiny, url)) as eng:
        rec = play_recorded(eng, tiny, TURNS)
        stats = eng.link.stats()
    assert assert_same_session(rec, reference, "embedded, corrupt block") == len(TURNS)
    assert rec.turns[0].hit_tokens["ssd"] == 3 * 64  # the prefix ends at the corrupt block
    assert stats is not None and stats.counters["corrupt_blocks_total"] == 1


def test_the_namespace_takes_the_tenant_of_the_daemon_token(
    tiny: LoadedModel, reference: Recorded, tmp_path: Path
) -> None:
    """With auth the daemon accepts only namespaces of the token's tenant: the engine asks
    which one that is, so its commits are stored and a second engine hits them."""
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-token-of-team-a team-a\n")
    opts = StoreOptions(dram_bytes=64 << 20, auth_token_file=str(tokens))

    def link() -> StoreLink:
        return open_store_link(daemon.url, lambda t: engine_namespace(tiny.spec, 64, t), opts)

    with DaemonProcess(["--dram", "64MiB", "--auth-token-file", str(tokens)]) as daemon:
        with engine_for(tiny, link()) as eng:
            assert eng.ns.tenant == "team-a"
            play_recorded(eng, tiny, TURNS)
        with engine_for(tiny, link()) as eng:
            second = play_recorded(eng, tiny, TURNS)
            assert eng.link.counters()["store_errors_total"] == 0
    # The first engine's commits landed before it closed: the daemon holds the whole first
    # prompt, and the second engine's pool starts empty.
    p0 = second.turns[0].prompt_tokens
    assert second.turns[0].hit_tokens == {"hbm": 0, "dram": (p0 - 1) // BLOCK * BLOCK, "ssd": 0}
    assert assert_same_session(second, reference, "grpc with auth") == len(TURNS)
