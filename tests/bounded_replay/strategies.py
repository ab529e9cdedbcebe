"""Hypothesis strategies: random layer layouts, windows, block sizes, lengths and hits."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from bounded_replay import ReplayPolicy, resolve_policy

windows = st.lists(st.one_of(st.none(), st.integers(1, 300)), min_size=1, max_size=10)
hybrid_windows = windows.filter(lambda w: None in w and any(x is not None for x in w))


@dataclass(frozen=True)
class Case:
    policy: ReplayPolicy
    prompt_tokens: int
    hit_blocks: int
    block_tokens: int


@st.composite
def policies(draw: st.DrawFn, layer_windows: st.SearchStrategy = windows) -> ReplayPolicy:
    w = draw(layer_windows)
    exact = draw(st.booleans())
    if exact:
        return resolve_policy(w, cache_all_layers=True)
    keep = draw(st.one_of(st.none(), st.integers(1, 700)))
    try:
        return resolve_policy(w, keep, force=True)
    except ValueError:  # bounded asked of a model with no full-attention layer
        return resolve_policy(w)


@st.composite
def cases(draw: st.DrawFn, layer_windows: st.SearchStrategy = windows) -> Case:
    policy = draw(policies(layer_windows))
    bt = draw(st.integers(1, 96))
    length = draw(st.integers(1, 4000))
    hit = draw(st.integers(0, (length - 1) // bt))
    return Case(policy, length, hit, bt)
