"""Block format (DESIGN §4): layout pinned byte by byte, every mismatch its own error."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvstore import errors
from kvstore.block import (
    HEADER_BYTES,
    check_header,
    decode_header,
    encode_block,
    encode_block_into,
    verify_block,
    verify_rows,
)

FP = bytes(range(16))
KEY = bytes(range(16, 32))
PAYLOAD = bytes(range(256)) * 8


def test_header_layout_is_exactly_the_spec() -> None:
    blob = encode_block(FP, KEY, PAYLOAD, created_at_us=1_700_000_000_000_000)
    assert len(blob) == 64 + len(PAYLOAD)
    assert blob[0:4] == b"KVB1"
    assert struct.unpack_from("<H", blob, 4)[0] == 1
    assert struct.unpack_from("<H", blob, 6)[0] == 0
    assert blob[8:24] == FP
    assert blob[24:40] == KEY
    assert struct.unpack_from("<Q", blob, 40)[0] == len(PAYLOAD)
    assert struct.unpack_from("<Q", blob, 48)[0] == xxhash.xxh3_64_intdigest(PAYLOAD)
    assert struct.unpack_from("<Q", blob, 56)[0] == 1_700_000_000_000_000
    assert blob[64:] == PAYLOAD


def test_encode_into_matches_encode() -> None:
    out = bytearray(HEADER_BYTES + len(PAYLOAD) + 10)
    n = encode_block_into(memoryview(out), FP, KEY, PAYLOAD, created_at_us=5)
    assert bytes(out[:n]) == encode_block(FP, KEY, PAYLOAD, created_at_us=5)
    with pytest.raises(ValueError):
        encode_block_into(memoryview(bytearray(10)), FP, KEY, PAYLOAD)


@given(
    st.binary(min_size=0, max_size=4096),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=16, max_size=16),
)
def test_roundtrip(payload: bytes, fp: bytes, key: bytes) -> None:
    blob = encode_block(fp, key, payload)
    assert bytes(verify_block(blob, fingerprint=fp, key=key, payload_len=len(payload))) == payload
    assert decode_header(blob).payload_len == len(payload)


def _mutate(offset: int, value: bytes) -> bytes:
    blob = bytearray(encode_block(FP, KEY, PAYLOAD))
    blob[offset : offset + len(value)] = value
    return bytes(blob)


@pytest.mark.parametrize(
    ("blob", "kwargs", "error"),
    [
        (_mutate(0, b"KVB2"), {}, errors.BlockMagicError),
        (_mutate(4, struct.pack("<H", 2)), {}, errors.BlockVersionError),
        (encode_block(FP, KEY, PAYLOAD), {"fingerprint": bytes(16)}, errors.BlockFingerprintError),
        (encode_block(FP, KEY, PAYLOAD), {"key": bytes(16)}, errors.BlockKeyError),
        (encode_block(FP, KEY, PAYLOAD), {"payload_len": 17}, errors.BlockLengthError),
        (_mutate(64 + 100, b"\xff"), {}, errors.BlockChecksumError),
        (_mutate(48, b"\x00" * 8), {}, errors.BlockChecksumError),
        (encode_block(FP, KEY, PAYLOAD)[:40], {}, errors.BlockTruncatedError),
        (encode_block(FP, KEY, PAYLOAD)[:-1], {}, errors.BlockTruncatedError),
    ],
)
def test_each_mismatch_raises_its_own_error(blob: bytes, kwargs: dict, error: type) -> None:
    args = {"fingerprint": FP, "key": KEY, "payload_len": len(PAYLOAD)} | kwargs
    with pytest.raises(error):
        verify_block(blob, **args)
    assert issubclass(error, errors.BlockError)


@given(st.integers(0, 64 + len(PAYLOAD) - 1), st.integers(0, 7))
def test_any_single_bit_flip_is_detected(pos: int, bit: int) -> None:
    blob = bytearray(encode_block(FP, KEY, PAYLOAD, created_at_us=1))
    blob[pos] ^= 1 << bit
    if 56 <= pos < 64:  # created-at is informational, not protected
        verify_block(blob, fingerprint=FP, key=KEY, payload_len=len(PAYLOAD))
        return
    with pytest.raises(errors.BlockError):
        verify_block(blob, fingerprint=FP, key=KEY, payload_len=len(PAYLOAD))


def test_a_given_checksum_is_carried_not_recomputed() -> None:
    # A block keeps the checksum made at its commit: re-encoding damaged bytes with it
    # yields a block that fails verification instead of a freshly valid one.
    stored = xxhash.xxh3_64_intdigest(PAYLOAD)
    damaged = bytearray(PAYLOAD)
    damaged[5] ^= 1
    blob = encode_block(FP, KEY, damaged, checksum=stored)
    assert struct.unpack_from("<Q", blob, 48)[0] == stored
    with pytest.raises(errors.BlockChecksumError):
        verify_block(blob, fingerprint=FP, key=KEY)
    payload, csum = check_header(blob, fingerprint=FP, key=KEY, payload_len=len(PAYLOAD))
    assert csum == stored and bytes(payload) == bytes(damaged)  # header checks only


@given(
    st.lists(st.binary(min_size=8, max_size=8), min_size=0, max_size=12),
    st.integers(-1, 12),
)
def test_verify_rows_returns_the_checked_prefix(rows: list[bytes], bad: int) -> None:
    sums = [xxhash.xxh3_64_intdigest(r) for r in rows]
    buf = bytearray(b"".join(rows))
    if 0 <= bad < len(rows):
        buf[bad * 8 + 3] ^= 0x40
    expect = bad if 0 <= bad < len(rows) else len(rows)
    assert verify_rows(memoryview(buf), 8, sums) == expect
    assert verify_rows(memoryview(buf), 8, sums[:1]) == min(1, expect)
