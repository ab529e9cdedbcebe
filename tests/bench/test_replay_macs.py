"""``bench/replay_macs.py``: the multiply-add count the row cut's measurement is read
against, checked by hand on a two-layer model and for its orderings on Gemma 3's shape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.replay_macs import Shape, count, main

# hidden 2, MLP 3, one head of 2, one KV head: qkv 2·3·2 = 12, o 2·2 = 4, MLP 3·2·3 = 18.
TWO = Shape(2, 3, 1, 1, 2, (2, None))
GEMMA3 = Shape(640, 2048, 4, 1, 256, tuple(([512] * 5 + [None]) * 3))


def test_a_two_layer_model_by_hand() -> None:
    assert (TWO.qkv, TWO.dense) == (12, 34)
    # position 3: the sliding layer sees 2 keys, the full one 4; 4 per key (2·1·2)
    assert TWO.token(3, [0, 1]) == (34 + 4 * 2) + (34 + 4 * 4)
    h = count(TWO, cached=4, new=1, keep=2)
    assert h.exact == TWO.token(4, [0, 1])
    # replayed positions 2 and 3 run nothing below the cut (it is layer 0) but its qkv
    assert h.bounded_cut == h.exact + 2 * 12
    assert h.bounded_nocut == h.exact + TWO.token(2, [0, 1]) + TWO.token(3, [0, 1])
    assert h.cold == sum(TWO.token(p, [0, 1]) for p in range(5))


@given(st.integers(600, 40_000), st.integers(1, 2048), st.integers(0, 1100))
def test_the_cut_saves_and_never_beats_the_exact_hit(cached: int, new: int, keep: int
                                                     ) -> None:
    h = count(GEMMA3, cached, new, keep)
    assert h.exact <= h.bounded_cut <= h.bounded_nocut <= h.cold
    assert (h.bounded_cut == h.exact) == (keep == 0)


def test_gemma3_at_32k_matches_the_recorded_prediction(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    h = count(GEMMA3, 31744, 1024, 524)
    assert round(h.bounded_nocut / h.exact, 2) == 1.50
    assert round(h.bounded_cut / h.exact, 2) == 1.38


def test_a_model_without_sliding_layers_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16, '
        '"num_attention_heads": 2}')
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path)])
    assert e.value.code == 2
    assert "no sliding layers" in capsys.readouterr().err
