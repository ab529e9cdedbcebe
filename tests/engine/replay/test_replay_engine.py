"""Bounded replay through the whole engine on a 4-layer hybrid checkpoint (issue 12): what a
hit recomputes, that exact mode and a keep covering the hit reproduce a cold prefill, what
the store keeps, and that a replay never writes a block another request may read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.kv.namespace import engine_namespaces
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from kvstore.tier import KVStore
from tests.engine.model.compare import assert_logits_close
from tests.engine.replay.harness import BT, Run, cold, config, engine, fill, request, tokens

KEEP = 24 + 12  # the checkpoint's 24-token window + the margin


@pytest.fixture
def store() -> Iterator[KVStore]:
    s = open_embedded(dram_bytes=64 << 20)
    yield s
    s.close()


def hit_run(lm: LoadedModel, store: KVStore, cfg, prompt: list[int], hit_blocks: int,  # type: ignore[no-untyped-def]
            new: int = 4) -> tuple[Run, dict[str, int]]:
    """Store ``hit_blocks`` of ``prompt`` computed cold, then run it in a fresh engine."""
    fill(lm, cfg, store, prompt[: hit_blocks * BT])
    with engine(lm, cfg, store) as eng:
        run = request(eng, prompt, new)
        return run, eng.store_counters()


def bytes_per_token_all_layers(lm: LoadedModel) -> int:
    s = lm.spec
    return s.num_layers * 2 * s.num_kv_heads * s.head_dim * 4  # float32 K and V


def assert_pool_holds_store_blocks(eng, store: KVStore, keys: list[bytes],  # type: ignore[no-untyped-def]
                                   block_ids: list[int]) -> None:
    ns = eng.ns
    rows = torch.empty((len(keys), *ns.payload_shape), dtype=torch.float32)
    assert store.get_into(ns, keys, rows) == len(keys)
    for j, layer in enumerate(ns.cached_layers):
        assert torch.equal(eng.cache.k[layer][block_ids], rows[:, j, 0])
        assert torch.equal(eng.cache.v[layer][block_ids], rows[:, j, 1])


def test_sliding_layers_never_read_the_pool_before_the_replay_start(deep: LoadedModel) -> None:
    """Whatever the pool held before (zeros, garbage, another request's KV), the replay's
    result is the same: its sliding layers see nothing before ``kv_start``."""
    p = tokens(300, 8)
    cfg = config(KEEP)
    runs = []
    for garbage in (False, True):
        store = open_embedded(dram_bytes=64 << 20)  # each run commits what it computed
        try:
            fill(deep, cfg, store, p[: 14 * BT])
            with engine(deep, cfg, store) as eng:
                if garbage:
                    eng.cache.storage.normal_(generator=torch.Generator().manual_seed(1))
                runs.append(request(eng, p))
        finally:
            store.close()
    assert runs[0].seq.stats.replayed_tokens == runs[1].seq.stats.replayed_tokens == KEEP
    assert torch.equal(runs[0].logits, runs[1].logits)


def test_the_checkpoint_defaults_to_exact_and_opts_into_bounded_keep(
        deep: LoadedModel) -> None:
    """Exact by default (the rule in bounded_replay/README.md); bounded replay is asked
    for with a keep, the safe minimum being the largest window + 12."""
    default = config().replay_policy(deep.spec.layer_windows)
    assert not default.is_bounded and default.keep_tokens == 0
    policy = config(KEEP).replay_policy(deep.spec.layer_windows)
    assert policy.is_bounded and policy.keep_tokens == KEEP
    assert deep.spec.sliding_layers == (0, 2) and deep.spec.full_attention_layers == (1, 3)


@pytest.mark.parametrize("keep", [300, 1000])
def test_a_keep_covering_the_prompt_reproduces_a_cold_prefill(
    deep: LoadedModel, store: KVStore, keep: int
) -> None:
    p = tokens(300, 1)
    run, _ = hit_run(deep, store, config(keep), p, 12)
    ref = cold(deep, p)
    s = run.seq.stats
    assert s.hit_tokens["dram"] == 12 * BT
    assert s.replayed_tokens == 12 * BT and s.computed_tokens == 300  # replayed from 0
    assert run.seq.output_ids == ref.seq.output_ids
    assert_logits_close(run.logits, ref.logits, f"keep {keep}")


def test_exact_mode_reproduces_a_cold_prefill_loading_sliding_layers_for_the_window(
    deep: LoadedModel, store: KVStore
) -> None:
    p = tokens(300, 2)
    cfg = config(exact=True)
    run, counters = hit_run(deep, store, cfg, p, 15)
    ref = cold(deep, p)
    s = run.seq.stats
    assert s.hit_tokens["dram"] == 240 and s.replayed_tokens == 0
    assert s.computed_tokens == run.prefill_forward_tokens == 300 - 240
    assert run.seq.output_ids == ref.seq.output_ids
    assert_logits_close(run.logits, ref.logits, "exact")
    # The full layers of all 15 blocks; the sliding layers only of the blocks the first new
    # token's 24-token window reaches: positions 217..239, blocks 13 and 14.
    ns = engine_namespaces(deep.spec, BT, cfg.replay_policy(deep.spec.layer_windows))
    assert ns.sliding is not None
    want = 15 * ns.primary.block_bytes + 2 * ns.sliding.block_bytes
    assert counters["loaded_bytes_total"] == want


@pytest.mark.parametrize(("length", "hit_blocks", "keep"),
                         [(300, 12, KEEP), (300, 18, 60), (500, 25, KEEP), (200, 1, KEEP),
                          (257, 16, 37)])
def test_a_hit_recomputes_keep_plus_new_tokens(
    deep: LoadedModel, store: KVStore, length: int, hit_blocks: int, keep: int
) -> None:
    p = tokens(length, length + hit_blocks)
    run, _ = hit_run(deep, store, config(keep), p, hit_blocks)
    hit, k = hit_blocks * BT, keep
    want = min(k, hit) + (length - hit)
    s = run.seq.stats
    assert s.hit_tokens["dram"] == hit
    assert run.prefill_forward_tokens == want  # counted by the runner, token by token
    assert s.computed_tokens == want and s.replayed_tokens == min(k, hit)


def test_bounded_replay_drifts_from_a_cold_prefill(deep: LoadedModel, store: KVStore) -> None:
    """The replay is not silently exact: with the default keep the sliding windows start
    from less context than a cold prefill had, and the logits show it."""
    p = tokens(400, 3)
    run, _ = hit_run(deep, store, config(KEEP), p, 20)
    ref = cold(deep, p)
    diff = (run.logits[0] - ref.logits[0]).abs().max().item()
    assert 1e-5 < diff < 10.0


def test_stored_bytes_per_token_are_the_full_layer_share_and_one_tail(
        deep: LoadedModel) -> None:
    """Bounded: every token's full layers plus, per committed end, the sliding layers of
    its last window (``tail_blocks`` = ceil(23 / 16) = 2 blocks); exact: every layer.
    Checked against what the store really holds."""
    layer = bytes_per_token_all_layers(deep) // deep.spec.num_layers
    full, sliding = len(deep.spec.full_attention_layers), 2
    end = 26 * BT  # the request's committed end: 420 prompt tokens (+ 3 computed answers)
    for cfg, want in ((config(KEEP), layer * (full + sliding * 2 * BT / end)),
                      (config(exact=True), bytes_per_token_all_layers(deep))):
        s = open_embedded(dram_bytes=64 << 20)
        try:
            fill(deep, cfg, s, tokens(320, 4))  # bounded: no tail at this end
            with engine(deep, cfg, s) as eng:
                request(eng, tokens(320, 4) + tokens(100, 5))
                eng.drain()
                assert eng.stored_bytes_per_token(end) == want
            (dram,) = s.stats().tiers
            assert dram.used_bytes == want * end  # what the store really holds
        finally:
            s.close()


def test_a_replay_writes_private_copies_of_shared_pool_blocks(
    deep: LoadedModel, store: KVStore
) -> None:
    p = tokens(400, 6)
    cfg = config(KEEP)
    fill(deep, cfg, store, p[: 6 * BT])
    with engine(deep, cfg, store) as eng:
        # Z loads 5 blocks (full layers only) and replays from 80 − 36 = 44 into them.
        z = request(eng, p[: 5 * BT + 1])
        assert z.seq.stats.replayed_tokens == KEEP
        keys = eng.kv.keys(z.seq)
        shared = [b.block_id for b in eng.blocks.pool.longest_prefix(keys[:5])]
        assert len(shared) == 5
        # The replay kept the cached full-layer KV: the pool holds the store's bytes.
        assert_pool_holds_store_blocks(eng, store, keys[:5], shared)
        before = eng.cache.storage[:, :, shared].clone()
        # Y hits those 5 in the pool (a store-loaded bounded block still replays) and loads
        # the 6th: its replay starts at 96 − 36 = 60, inside the pool's blocks 3 and 4.
        y = request(eng, p[: 8 * BT + 10])
        assert y.seq.stats.hit_tokens == {"hbm": 5 * BT, "dram": BT, "ssd": 0}
        assert y.seq.stats.replayed_tokens == KEEP
        assert eng.blocks.counters["private_copies_total"] == 2
        assert torch.equal(eng.cache.storage[:, :, shared], before), "Z's blocks rewritten"
        # A pool hit whose window blocks the engine computed (all layers) replays nothing.
        w = request(eng, p[: 8 * BT + 10] + y.seq.output_ids[:-1] + tokens(30, 7))
        assert w.seq.stats.replayed_tokens == 0 and w.seq.stats.hit_tokens["hbm"] == 8 * BT
    # The same Y in a fresh engine over a store holding what Y's engine loaded: the private
    # copies carried the cached full-layer KV, so the two replays agree exactly.
    other = open_embedded(dram_bytes=64 << 20)
    try:
        fill(deep, cfg, other, p[: 6 * BT])
        with engine(deep, cfg, other) as eng:
            y2 = request(eng, p[: 8 * BT + 10])
        assert y2.seq.stats.replayed_tokens == KEEP
        assert torch.equal(y2.logits, y.logits)
    finally:
        other.close()
