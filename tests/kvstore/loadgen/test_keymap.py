"""Trace ids → namespaces and keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.loadgen.errors import LoadgenError
from kvstore.loadgen.keymap import KeyMapper, block_key, encode_id, namespace_for


@pytest.mark.parametrize("b,bpt", [(512, 32), (64, 1), (16, 3)])
def test_block_bytes_is_tokens_times_bytes_per_token(b: int, bpt: int) -> None:
    ns = namespace_for("x", b, bpt)
    assert ns.block_bytes == b * bpt
    assert ns.kv_dtype == "uint8" and ns.kv_layout == "mla"


@given(st.lists(st.integers(-(2**130), 2**130), min_size=1, max_size=30))
def test_equal_ids_equal_keys_distinct_ids_distinct_keys(ids: list[int]) -> None:
    ns = namespace_for("mooncake", 512, 4)
    m = KeyMapper("mooncake", ["a.jsonl"], 4)
    keys = m.keys(ns, ids)
    assert all(len(k) == 16 for k in keys)
    assert len(set(keys)) == len(set(ids))
    assert m.keys(ns, ids[:1]) == keys[:1]  # a prefix of ids is a prefix of keys


def test_encodings_do_not_collide() -> None:
    encoded = {encode_id(5), encode_id(2**200), encode_id(b"\x05" * 16), encode_id(-5)}
    assert len(encoded) == 4
    with pytest.raises(LoadgenError):
        encode_id(True)
    with pytest.raises(LoadgenError):
        encode_id(1.5)  # type: ignore[arg-type]


def test_session_files_are_separate_namespaces_with_stable_keys() -> None:
    two = KeyMapper("kv-cache-tester", ["d/s0.json", "d/s1.json"], 2)
    three = KeyMapper("kv-cache-tester", ["d/a.json", "d/s0.json", "d/s1.json"], 2)
    ns0, ns1 = two.namespace(0, 64), two.namespace(1, 64)
    assert ns0 != ns1 and ns0.model_id == "loadgen/s0.json"
    # Local id 7 of file index i arrives scoped as 7 * files + i (the reader's scoping).
    k0 = two.keys(ns0, [7 * 2 + 0])
    k1 = two.keys(ns1, [7 * 2 + 1])
    assert k0 != k1
    # The same file in a run of three files gets the same keys.
    assert three.keys(three.namespace(1, 64), [7 * 3 + 1]) == k0
    assert k0 == [block_key(ns0, 7)]


def test_one_namespace_for_all_mooncake_files() -> None:
    m = KeyMapper("mooncake", ["a.jsonl", "b.jsonl"], 4)
    assert m.namespace(0, 512) is m.namespace(1, 512)
    assert len(m.namespaces()) == 1


def test_bad_bytes_per_token() -> None:
    with pytest.raises(LoadgenError):
        KeyMapper("mooncake", ["a"], 0)


def test_check_integrity_catches_a_shared_namespace() -> None:
    from kvstore.errors import IntegrityError

    m = KeyMapper("kv-cache-tester", ["s0.json", "s1.json"], 2)
    m.namespace(0, 64)
    m.namespace(1, 64)
    m.check_integrity()
    m._namespaces[(1, 64)] = m.namespace(0, 64)  # two sessions merged: a bug to catch
    with pytest.raises(IntegrityError):
        m.check_integrity()
