"""What the store keeps: bounded and exact blocks never share a namespace, and the bytes a
bounded store keeps per token are the full-attention layers' share."""

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


def test_bounded_keeps_the_full_layers_in_a_namespace_of_its_own() -> None:
    b = stored_namespaces(base(), resolve(HYBRID, 140))
    e = stored_namespaces(base(), resolve(HYBRID, cache_all_layers=True))
    assert b.sliding is None and b.primary.cached_layers == (1, 3, 5, 7)
    assert e.primary.cached_layers == (1, 3, 5, 7) and e.sliding is not None
    assert e.sliding.cached_layers == (0, 2, 4, 6)
    # Same layers, yet never the same blocks: bounded blocks carry the replay's drift.
    tokens = list(range(256))
    assert not set(chain_keys(b.primary, tokens)) & set(chain_keys(e.primary, tokens))
    other_keep = stored_namespaces(base(), resolve(HYBRID, 256)).primary
    assert other_keep.fingerprint != b.primary.fingerprint
    assert b.block_bytes * 2 == e.block_bytes == base().block_bytes
    assert b.bytes_per_token == base().block_bytes / 64 / 2


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
    if policy.is_bounded:
        assert sorted(stored) == list(policy.layout.full_layers)
    else:
        assert sorted(stored) == list(range(n))


def test_a_base_namespace_must_hold_every_layer() -> None:
    with pytest.raises(ReplayError, match="not the model's 8 layers"):
        stored_namespaces(base(4), resolve(HYBRID))
