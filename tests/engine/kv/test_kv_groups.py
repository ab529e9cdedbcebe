"""KV groups: which layers share a page, for the models the engine serves."""

from __future__ import annotations

import pytest

from engine.errors import EngineIntegrityError
from engine.kv.kv_groups import KVGroupLayout

#: Gemma 3 270M: 18 layers, every sixth full, the others slide over 512 tokens.
GEMMA3_270M = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))


def test_gemma3_270m_has_one_full_group_and_five_sliding_groups_of_three_layers() -> None:
    lay = KVGroupLayout.for_windows(GEMMA3_270M)
    assert lay.groups[0] == (5, 11, 17)
    assert lay.unit_layers == 3 and lay.num_sliding_groups == 5 and lay.pages_per_block == 6
    assert sorted(x for g in lay.groups[1:] for x in g) == [i for i in range(18) if (i + 1) % 6]
    assert {lay.slot_of(x) for x in range(18)} == {0, 1, 2}
    assert lay.window_tokens == 512


@pytest.mark.parametrize("windows", [(None, None), (128, 128), (None, None, 8), (8, None, None)])
def test_a_model_without_both_kinds_or_with_uneven_groups_keeps_one_group(
        windows: tuple[int | None, ...]) -> None:
    lay = KVGroupLayout.for_windows(windows)
    assert lay.groups == (tuple(range(len(windows))),) and not lay.is_hybrid
    assert lay.window_first_block(10_000, 16) == 0  # nothing ever leaves a window


@pytest.mark.parametrize(("position", "first"), [(0, 0), (511, 0), (512, 0), (527, 1),
                                                 (528, 1), (1023, 32)])
def test_the_first_visible_block_follows_transformers_window(position: int, first: int) -> None:
    # The query at ``position`` sees keys j with position - j < 512.
    lay = KVGroupLayout.for_windows(GEMMA3_270M)
    assert lay.window_first_block(position, 16) == first


def test_groups_must_be_equal_and_cover_every_layer_once() -> None:
    with pytest.raises(EngineIntegrityError):
        KVGroupLayout(((0, 1), (2,)), 8)
    with pytest.raises(EngineIntegrityError):
        KVGroupLayout(((0,), (0,)), 8)
    with pytest.raises(EngineIntegrityError):
        KVGroupLayout(((0,), (1,)), 0)
