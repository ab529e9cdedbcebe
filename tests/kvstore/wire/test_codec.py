"""Chunked block framing and namespace messages (DESIGN §4, §7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.block import HEADER_BYTES
from kvstore.errors import BlockError, InvalidArgument
from kvstore.keys import Namespace, chain_keys
from kvstore.wire import codec
from tests.conftest import small_ns


def roundtrip(ns: Namespace, n: int) -> tuple[int, bytes, bytes]:
    keys = chain_keys(ns, list(range(n * ns.block_tokens)))
    src = (np.arange(n * ns.block_bytes) % 251).astype(np.uint8).tobytes()
    dst = bytearray(len(src))
    asm = codec.BlockAssembler(ns, keys, memoryview(dst), {i: i for i in range(n)})
    chunks = 0
    for i in range(n):
        for c in codec.iter_chunks(
            i, ns.fingerprint, keys[i], memoryview(src)[i * ns.block_bytes :][: ns.block_bytes]
        ):
            assert len(c.data) <= codec.CHUNK_BYTES
            chunks += 1
            asm.add(c)
    assert asm.complete == list(range(n))
    return chunks, src, bytes(dst)


@pytest.mark.parametrize(
    "head_dim, chunks_per_block", [(8, 1), (4096, 1), (8192, 2), (8193, 2), (16384, 3)]
)
def test_blocks_cross_chunk_boundaries(head_dim: int, chunks_per_block: int) -> None:
    # 16 tokens x 2 layers x K/V x 1 head x head_dim x 2 bytes = 128 x head_dim bytes.
    ns = small_ns(kv_heads=1, head_dim=head_dim)
    chunks, src, dst = roundtrip(ns, 2)
    assert src == dst and chunks == 2 * chunks_per_block
    assert (ns.block_bytes + HEADER_BYTES > codec.CHUNK_BYTES) == (chunks_per_block > 1)


def test_corruption_and_misframing_are_detected() -> None:
    ns = small_ns()
    keys = chain_keys(ns, list(range(2 * ns.block_tokens)))
    payload = memoryview(bytes(ns.block_bytes))
    (c,) = codec.iter_chunks(0, ns.fingerprint, keys[0], payload)
    asm = codec.BlockAssembler(ns, keys, memoryview(bytearray(2 * ns.block_bytes)), {0: 0, 1: 1})
    bad = type(c)(block_index=0, offset=0, data=c.data[:-1] + b"\x01", last=True)
    with pytest.raises(BlockError):
        asm.add(bad)
    for bad in (
        type(c)(block_index=5, offset=0, data=c.data, last=True),  # not announced
        type(c)(block_index=1, offset=10, data=c.data, last=True),  # gap
        type(c)(block_index=1, offset=0, data=c.data + b"x", last=True),  # too long
    ):
        with pytest.raises(InvalidArgument):
            asm.add(bad)
    wrong_key = next(codec.iter_chunks(1, ns.fingerprint, keys[0], payload))
    fresh = codec.BlockAssembler(ns, keys, memoryview(bytearray(2 * ns.block_bytes)), {0: 0, 1: 1})
    with pytest.raises(BlockError):
        fresh.add(wrong_key)


@given(
    model_id=st.text(min_size=1, max_size=12),
    layers=st.lists(st.integers(0, 200), min_size=1, max_size=5, unique=True),
    heads=st.integers(1, 64),
    head_dim=st.integers(1, 512),
    block_tokens=st.integers(1, 1024),
    tenant=st.text(max_size=8),
    dtype=st.sampled_from(["bfloat16", "float16", "float32", "float8_e4m3fn"]),
)
def test_namespace_round_trips(
    model_id: str,
    layers: list[int],
    heads: int,
    head_dim: int,
    block_tokens: int,
    tenant: str,
    dtype: str,
) -> None:
    ns = Namespace(
        model_id, "rev", dtype, "mha", tuple(layers), heads, head_dim, block_tokens, tenant=tenant
    )
    back = codec.ns_from_proto(codec.ns_to_proto(ns))
    assert back == ns and back.fingerprint == ns.fingerprint


def test_fingerprint_mismatch_and_bad_keys() -> None:
    spec = codec.ns_to_proto(small_ns())
    spec.fingerprint = b"\0" * 16
    with pytest.raises(InvalidArgument):
        codec.ns_from_proto(spec)
    with pytest.raises(InvalidArgument):
        codec.check_keys([b"\0" * 15])
    with pytest.raises(InvalidArgument):
        codec.durability_to_proto("tape")


@given(payload_bytes=st.sampled_from([1, 4096, codec.CHUNK_BYTES - HEADER_BYTES,
                                      codec.CHUNK_BYTES - HEADER_BYTES + 1, 3 * codec.CHUNK_BYTES]))
def test_an_encoded_block_is_cut_like_header_and_payload(payload_bytes: int) -> None:
    """The node client sends blocks it encoded once; the daemon and nodes cut header and
    payload: one chunker, so both streams carry the same chunks."""
    payload = np.random.default_rng(payload_bytes).integers(0, 256, payload_bytes, np.uint8)
    fp, key = b"f" * 16, b"k" * 16
    want = list(codec.iter_chunks(3, fp, key, memoryview(payload.tobytes())))
    # the same header (its created-at included), encoded once as the node client does
    block = bytes(want[0].data[:HEADER_BYTES]) + payload.tobytes()
    got = list(codec.encoded_chunks(3, block))
    assert [(c.block_index, c.offset, bytes(c.data), c.last) for c in got] == [
        (c.block_index, c.offset, bytes(c.data), c.last) for c in want
    ]
    assert all(len(c.data) <= codec.CHUNK_BYTES for c in got) and got[-1].last


@given(n=st.integers(1, 6), data=st.data())
def test_the_prefix_is_the_gapless_verified_run_from_block_zero(
    n: int, data: st.DataObject
) -> None:
    ns = small_ns()
    keys = chain_keys(ns, list(range(n * ns.block_tokens)))
    src = (np.arange(n * ns.block_bytes) % 251).astype(np.uint8).tobytes()
    sent = data.draw(st.lists(st.integers(0, n - 1), unique=True), label="sent")
    bad = data.draw(st.sampled_from([None, *sent]), label="bad")
    asm = codec.BlockAssembler(ns, keys, memoryview(bytearray(len(src))), {i: i for i in range(n)})
    for i in sent:
        payload = bytearray(src[i * ns.block_bytes : (i + 1) * ns.block_bytes])
        chunks = list(codec.iter_chunks(i, ns.fingerprint, keys[i], memoryview(payload)))
        if i == bad:  # damaged after the checksum was taken: fails at the receiver
            chunks[-1].data = chunks[-1].data[:-1] + bytes([chunks[-1].data[-1] ^ 1])
        for c in chunks:
            try:
                asm.add(c)
            except BlockError:
                assert i == bad
    want = 0
    while want in sent and want != bad:
        want += 1
    assert asm.prefix_blocks == want
    assert asm.prefix_checksums() == [asm.checksums[i] for i in range(want)]
    assert asm.prefix_checksums(limit=1) == asm.prefix_checksums()[:1]
