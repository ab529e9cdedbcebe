"""Payloads: determinism, golden bytes, and that every kind of damage is caught."""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvstore.loadgen.keymap import block_key, namespace_for
from kvstore.loadgen.payload import PayloadMaker

NS = namespace_for("mooncake", 512, 4)  # 2 KiB blocks


def keys(n: int) -> list[bytes]:
    return [block_key(NS, i) for i in range(n)]


def test_payload_is_a_function_of_namespace_and_key_only() -> None:
    a, b = PayloadMaker(), PayloadMaker()
    ks = keys(5)
    assert np.array_equal(a.rows(NS, ks), b.rows(NS, ks))
    assert np.array_equal(a.rows(NS, ks[2:3])[0], b.rows(NS, ks)[2])
    other = namespace_for("other", 512, 4)
    assert not np.array_equal(a.rows(NS, ks[:1]), a.rows(other, ks[:1]))
    assert a.rows(NS, ks).shape == (5, NS.block_bytes)


def test_golden_payload_bytes() -> None:
    # Any process (or language) regenerating payloads must agree on these bytes.
    row = PayloadMaker().rows(NS, [block_key(NS, 0)])[0]
    assert NS.block_bytes == 2048
    assert block_key(NS, 0).hex() == GOLDEN_KEY
    assert row[:16].tobytes().hex() == GOLDEN_ROW_HEAD


GOLDEN_KEY = "9213939071291bf95364a5254bd94217"
GOLDEN_ROW_HEAD = "18df8babc9898cb0b5f8eaa5ab6079ad"


def test_payload_follows_the_documented_formula() -> None:
    # Re-derived with plain bytes from the formula in payload.py's docstring.
    key = block_key(NS, 12345)
    assert key == xxhash.xxh3_128_digest(NS.fingerprint + b"i" + (12345).to_bytes(16, "little"))
    pad = b"".join(
        xxhash.xxh3_128_digest(b"kvstore-loadgen-pad" + NS.fingerprint + j.to_bytes(8, "little"))
        for j in range(NS.block_bytes // 16)
    )
    want = bytes(p ^ key[i % 16] for i, p in enumerate(pad))
    assert PayloadMaker().rows(NS, [key])[0].tobytes() == want


def test_rows_differ_between_keys_and_positions() -> None:
    rows = PayloadMaker().rows(NS, keys(4))
    for i in range(4):
        for j in range(i + 1, 4):
            assert (rows[i] != rows[j]).sum() > NS.block_bytes // 2
    # No 16-byte period: a row shifted by one key width does not match itself.
    assert not np.array_equal(rows[0][16:], rows[0][:-16])


def test_block_sizes_not_a_multiple_of_16() -> None:
    ns = namespace_for("odd", 3, 7)  # 21-byte blocks
    pm = PayloadMaker()
    rows = pm.rows(ns, [block_key(ns, 1), block_key(ns, 2)])
    assert rows.shape == (2, 21)
    assert pm.check(ns, [block_key(ns, 1), block_key(ns, 2)], rows.copy()) == []


def test_clean_rows_check_clean() -> None:
    pm = PayloadMaker()
    ks = keys(6)
    assert pm.check(NS, ks, pm.rows(NS, ks).copy()) == []


@given(
    block=st.integers(0, 5),
    offset=st.integers(0, NS.block_bytes - 1),
    xor=st.integers(1, 255),
)
def test_any_single_flipped_byte_is_found_and_named(block: int, offset: int, xor: int) -> None:
    pm = PayloadMaker()
    ks = keys(6)
    got = pm.rows(NS, ks).copy()
    got[block, offset] ^= xor
    bad = pm.check(NS, ks, got)
    assert len(bad) == 1
    assert (bad[0].index, bad[0].key, bad[0].wrong_bytes, bad[0].first_offset) == (
        block,
        ks[block],
        1,
        offset,
    )


def test_swapped_and_zeroed_rows_are_found() -> None:
    pm = PayloadMaker()
    ks = keys(3)
    got = pm.rows(NS, ks).copy()
    got[[0, 1]] = got[[1, 0]]
    assert [m.index for m in pm.check(NS, ks, got)] == [0, 1]
    got = pm.rows(NS, ks).copy()
    got[2] = 0
    (m,) = pm.check(NS, ks, got)
    assert m.index == 2 and m.wrong_bytes > NS.block_bytes * 0.9
