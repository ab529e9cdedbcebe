"""``bench_replay --keeps``: which bounded modes a run measures beside exact mode (the
figures themselves come only from running the benchmark)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.bench_replay import mode_name, parse_keeps
from bounded_replay.errors import ReplayError

# Gemma 3 270M's pattern: five sliding layers of 512 tokens, then a full one, three times.
GEMMA3 = ([512] * 5 + [None]) * 3


def test_default_is_the_largest_window_plus_12_and_keeps_its_old_name() -> None:
    assert parse_keeps("default", GEMMA3) == (524,)
    assert mode_name(524, 524) == "bounded"


def test_a_forced_keep_beside_the_default_gets_its_own_mode() -> None:
    keeps = parse_keeps("default,140", GEMMA3)
    assert keeps == (524, 140)
    assert [mode_name(k, 524) for k in keeps] == ["bounded", "bounded-k140"]
    # a case is "<mode>_<tier>": the tier must stay the text after the last "_"
    assert all("_" not in mode_name(k, 524) for k in keeps)


@given(st.lists(st.integers(min_value=1, max_value=100_000), min_size=1, max_size=6))
def test_counts_come_back_once_each_in_the_order_given(counts: list[int]) -> None:
    got = parse_keeps(",".join(map(str, counts)), GEMMA3)
    assert got == tuple(dict.fromkeys(counts))


@pytest.mark.parametrize("text", ["0", "-5", "abc", "140,", "1.5"])
def test_bad_keeps_are_refused(text: str) -> None:
    with pytest.raises(ReplayError, match="--keeps"):
        parse_keeps(text, GEMMA3)


def test_default_on_a_model_without_sliding_layers_is_refused() -> None:
    with pytest.raises(ReplayError, match="no sliding layers"):
        parse_keeps("default", [None] * 4)
