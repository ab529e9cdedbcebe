"""What the store keeps: bounded and exact blocks never share a namespace, and the bytes a
bounded store keeps per token are the full-attention layers' share plus one window tail
per committed end."""

from __future__ import annotations

import pytest
from hypothesis import given

from bounded_replay import ReplayError, ReplayPolicy, stored_namespaces
from bounded_replay import resolve_policy as resolve
from kvstore.keys import Namespace, chain_keys
from tests.bounded_replay.strategies import policies

HYBRID = [128, None] * 4


def base(layers: int = 8) -> Namespace:
    return Namespace(model_id="m", model_revision="r1", kv_dtype="bfloat16", kv_layout="mha",
                     cached_layers=tuple(range(layers)), kv_heads=2, head_dim=64)


def test_bounded_keeps_the_full_layers_and_window_tails_in_namespaces_of_its_own() -> None:
    b = stored_namespaces(base(), resolve(HYBRID, 140))
    e = stored_namespaces(base(), resolve(HYBRID, cache_all_layers=True))
    assert b.primary.cached_layers == (1, 3, 5, 7) and b.sliding is not None
    assert b.sliding.cached_layers == (0, 2, 4, 6) and b.tail_blocks == 2  # ceil(127 / 64)
    assert e.primary.cached_layers == (1, 3, 5, 7) and e.sliding is not None
    assert e.sliding.cached_layers == (0, 2, 4, 6) and e.tail_blocks == 0
    # Same layers, yet never the same blocks: bounded blocks carry the replay's drift, the
    # tails included.
    tokens = list(range(256))
    for bns, ens in ((b.primary, e.primary), (b.sliding, e.sliding)):
        assert not set(chain_keys(bns, tokens)) & set(chain_keys(ens, tokens))
        assert bns.model_revision == "r1+bounded-keep140"
    other_keep = stored_namespaces(base(), resolve(HYBRID, 256))
    assert other_keep.primary.fingerprint != b.primary.fingerprint
    assert other_keep.sliding is not None
    assert other_keep.sliding.fingerprint != b.sliding.fingerprint
    assert b.block_bytes * 2 == e.block_bytes == base().block_bytes
    layer_bytes_per_token = base().block_bytes / 64 / 8
    assert e.bytes_per_token(4096) == 8 * layer_bytes_per_token
    # full + sliding x tail tokens / context: 4 layers, plus 4 layers of 128 tokens.
    assert b.tail_bytes == 2 * b.sliding.block_bytes
    assert b.bytes_per_token(4096) == layer_bytes_per_token * (4 + 4 * 128 / 4096)
    assert b.bytes_per_token(64) == layer_bytes_per_token * (4 + 4 * 64 / 64)  # one block
    with pytest.raises(ReplayError, match="context_tokens"):
        b.bytes_per_token(0)


def test_a_model_with_one_kind_of_layer_keeps_its_namespace() -> None:
    ns = stored_namespaces(base(3), resolve([None] * 3, 140))
    assert ns.all == (base(3),)  # the fingerprint of every store written before replay


@given(policies())
def test_every_layer_lands_in_exactly_one_namespace_or_none(policy: ReplayPolicy) -> None:
    n = policy.layout.num_layers
    ns = stored_namespaces(base(n), policy)
    stored = [layer for space in ns.all for layer in space.cached_layers]
    assert len(stored) == len(set(stored))
    assert ns.block_bytes == base(n).block_bytes * policy.stored_layer_fraction
    assert sorted(stored) == list(range(n))
    if policy.is_bounded:  # the sliding layers only as window tails
        assert ns.primary.cached_layers == policy.layout.full_layers
        assert ns.tail_blocks == policy.tail_blocks(64) >= 1
        w = policy.layout.max_window_tokens
        h = 4 * w  # an end far enough in: its tail is the blocks the next token sees
        assert h - policy.layout.window_first_block(h, 64) == ns.tail_blocks
    else:
        assert ns.tail_blocks == 0


def test_a_base_namespace_must_hold_every_layer() -> None:
    with pytest.raises(ReplayError, match="not the model's 8 layers"):
        stored_namespaces(base(4), resolve(HYBRID))
