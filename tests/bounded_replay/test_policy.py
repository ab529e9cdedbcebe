"""The safe defaults and the refusals (issue 12, item 2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_replay import (
    KEEP_MARGIN_TOKENS,
    KeepTooSmall,
    NoFullAttentionLayer,
    ReplayError,
    ReplayMode,
    ReplayRefused,
    default_keep_tokens,
    resolve_policy,
)
from tests.bounded_replay.strategies import hybrid_windows

HYBRID = [128, None] * 4  # the --hybrid preset: even layers slide with a 128-token window


def test_the_hybrid_preset_defaults_to_exact_and_opts_into_bounded_keep_140() -> None:
    """Exact is the default: the pre-registered rule (bounded_replay/README.md) failed on
    Gemma 3 270M; bounded replay is asked for with a keep, 140 the preset's safe minimum."""
    default = resolve_policy(HYBRID)
    assert default.mode is ReplayMode.EXACT and default.keep_tokens == 0
    assert default.stored_layer_fraction == 1.0 and "opt-in" in default.reason
    p = resolve_policy(HYBRID, 140)
    assert p.mode is ReplayMode.BOUNDED and p.keep_tokens == 140
    assert p.stored_layer_groups == ((1, 3, 5, 7), (0, 2, 4, 6))  # the sliding: tails only
    assert p.keeps_window_tails and p.tail_blocks(64) == 2
    assert p.stored_layer_fraction == 0.5  # of every token


@given(hybrid_windows)
def test_default_keep_is_the_largest_window_plus_the_margin(w: list[int | None]) -> None:
    want = max(x for x in w if x is not None) + KEEP_MARGIN_TOKENS
    assert default_keep_tokens(w) == want == resolve_policy(w, want).keep_tokens
    assert resolve_policy(w).mode is ReplayMode.EXACT  # not asked for: exact


@given(hybrid_windows, st.data())
def test_a_keep_below_the_default_is_refused_without_force(w: list[int | None],
                                                           data: st.DataObject) -> None:
    safe = default_keep_tokens(w)
    keep = data.draw(st.integers(1, safe - 1))
    with pytest.raises(KeepTooSmall, match="--force"):
        resolve_policy(w, keep)
    forced = resolve_policy(w, keep, force=True)
    assert forced.keep_tokens == keep and forced.is_bounded
    above = data.draw(st.integers(safe, safe + 500))
    assert resolve_policy(w, above).keep_tokens == above


def test_a_model_without_full_attention_refuses_bounded_mode() -> None:
    with pytest.raises(NoFullAttentionLayer, match="every layer slides"):
        resolve_policy([64, 64, 32], 140)
    with pytest.raises(ReplayRefused):
        resolve_policy([64, 64, 32], 10, force=True)  # force does not make it meaningful
    default = resolve_policy([64, 64, 32])  # not asked for: every layer cached
    assert default.mode is ReplayMode.EXACT and default.stored_layer_groups == ((0, 1, 2),)


@pytest.mark.parametrize("keep", [None, 1, 140, 5000])
def test_a_full_attention_only_model_ignores_keep(keep: int | None) -> None:
    p = resolve_policy([None, None, None], keep)
    assert p.mode is ReplayMode.EXACT and p.keep_tokens == 0
    assert p.stored_layer_groups == ((0, 1, 2),) and p.stored_layer_fraction == 1.0
    assert "keep ignored" in p.reason


def test_exact_mode_keeps_every_layer_in_two_groups() -> None:
    for p in (resolve_policy(HYBRID, cache_all_layers=True), resolve_policy(HYBRID, 0)):
        assert p.mode is ReplayMode.EXACT and p.keep_tokens == 0
        assert p.stored_layer_groups == ((1, 3, 5, 7), (0, 2, 4, 6))
        assert p.stored_layer_fraction == 1.0


def test_conflicting_or_bad_values_are_refused() -> None:
    with pytest.raises(ReplayError, match="exclude each other"):
        resolve_policy(HYBRID, 140, cache_all_layers=True)
    with pytest.raises(ReplayError, match=">= 0"):
        resolve_policy(HYBRID, -1)
    with pytest.raises(ReplayError, match="positive int"):
        resolve_policy([0, None])
    assert isinstance(KeepTooSmall("x"), ValueError)  # the CLIs print it and exit 2


def test_revision_tags_name_the_replay() -> None:
    assert resolve_policy(HYBRID, 140).revision_tag() == "+bounded-keep140"
    assert resolve_policy(HYBRID).revision_tag() == ""  # the default: exact
    assert resolve_policy(HYBRID, 256).revision_tag() == "+bounded-keep256"
    assert resolve_policy(HYBRID, cache_all_layers=True).revision_tag() == ""
