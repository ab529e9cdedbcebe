"""Keys and namespaces (DESIGN §3): golden vectors, an independent re-derivation, properties."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument, InvalidTokens
from kvstore.keys import Namespace, chain_keys, chain_root

NS1 = Namespace("llama-3.1-8b", "main", "bfloat16", "mha", tuple(range(32)), 8, 128)
NS2 = Namespace(
    "deepseek-v3",
    "abc123",
    "float8_e4m3fn",
    "mla",
    (0, 1, 2),
    1,
    576,
    block_tokens=32,
    tp_rank=1,
    tp_size=2,
    tenant="acme",
)
NS3 = Namespace("m", "r", "float16", "mha", (0,), 1, 8, hash_alg="blake2b_128")

# Pinned: any change to the encoding of namespaces, tokens or the chain breaks these.
GOLDEN = {
    "ns1_fp": "f09422a38a93982c6c5d40e1f37504da",
    "ns2_fp": "bd7e8329d40fe0816d63775f22313bfd",
    "ns1_keys": [
        "955b6cdeb21a8f3093afd7fa89a429e7",
        "cc9718ce5d80dcc2ddd5db28ed1e1642",
        "bfc538336fbaf33f75c1b02c5aae4f05",
    ],
    "ns2_keys": ["06bc2cdc37dd6477b52dd46828ffbc7e", "6b5514b49414d5ff9d7fd00e24a2cf1b"],
    "ns3_keys": ["538bd23b0e15561955bb3c157b6a502b", "bd6747d5202aac82d736778a3c244fda"],
}


def test_golden_vectors() -> None:
    assert NS1.fingerprint.hex() == GOLDEN["ns1_fp"]
    assert NS2.fingerprint.hex() == GOLDEN["ns2_fp"]
    assert [k.hex() for k in chain_keys(NS1, list(range(64 * 3 + 5)))] == GOLDEN["ns1_keys"]
    assert [k.hex() for k in chain_keys(NS2, [2**32 - 1] * 64)] == GOLDEN["ns2_keys"]
    keys = chain_keys(NS3, list(range(128)), secret=b"deployment-secret")
    assert [k.hex() for k in keys] == GOLDEN["ns3_keys"]


def test_independent_rederivation_from_the_spec_text() -> None:
    """Recompute DESIGN §3 from scratch with only msgpack, struct and xxhash."""
    fields = [
        "llama-3.1-8b",
        "main",
        "bfloat16",
        "mha",
        list(range(32)),
        8,
        128,
        64,
        0,
        1,
        "xxh3_128",
        "",
    ]
    fp = xxhash.xxh3_128(msgpack.packb(fields, use_bin_type=True)).digest()
    assert fp == NS1.fingerprint
    prev = xxhash.xxh3_128(fp).digest()
    tokens = list(range(64 * 3 + 5))
    expect = []
    for i in range(3):
        block = struct.pack("<64I", *tokens[i * 64 : (i + 1) * 64])
        prev = xxhash.xxh3_128(prev + block).digest()
        expect.append(prev)
    assert chain_keys(NS1, tokens) == expect
    assert chain_root(NS1) == xxhash.xxh3_128(fp).digest()


def test_blake2b_uses_the_deployment_secret() -> None:
    secret = b"deployment-secret"
    root = hashlib.blake2b(NS3.fingerprint, digest_size=16, key=secret).digest()
    k1 = hashlib.blake2b(
        root + struct.pack("<64I", *range(64)), digest_size=16, key=secret
    ).digest()
    assert chain_keys(NS3, list(range(64)), secret=secret) == [k1]
    assert chain_keys(NS3, list(range(64)), secret=b"other")[0] != k1
    with pytest.raises(InvalidArgument):
        chain_keys(NS3, list(range(64)))


@pytest.mark.parametrize(
    "tokens",
    [
        [2**32],
        [-1],
        [1.5, 2.0],
        np.array([2**32], dtype=np.int64),
        np.array([-3], dtype=np.int32),
        np.zeros((2, 64), dtype=np.int64),
        torch.tensor([2**40]),
        ["a"],
        [2**70],
    ],
)
def test_bad_token_ids_are_rejected(tokens) -> None:
    with pytest.raises(InvalidTokens):
        chain_keys(NS1, tokens)


def test_list_array_and_tensor_agree() -> None:
    toks = np.random.default_rng(0).integers(0, 2**32, 64 * 5, dtype=np.uint64)
    a = chain_keys(NS1, toks.tolist())
    assert a == chain_keys(NS1, toks)
    assert a == chain_keys(NS1, toks.astype(np.uint32))
    assert a == chain_keys(NS1, torch.from_numpy(toks.astype(np.int64)))


def test_partial_block_is_not_keyed() -> None:
    assert chain_keys(NS1, list(range(63))) == []
    assert len(chain_keys(NS1, list(range(64 * 2 + 63)))) == 2


token_lists = st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=64 * 6)


@given(token_lists, token_lists)
def test_prefix_property(a: list[int], b: list[int]) -> None:
    ka, kab = chain_keys(NS1, a), chain_keys(NS1, a + b)
    full = len(a) // 64
    assert kab[:full] == ka[:full]


@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=64 * 4, max_size=64 * 4),
    st.integers(0, 64 * 4 - 1),
)
def test_changing_block_i_changes_keys_i_to_n_only(tokens: list[int], pos: int) -> None:
    changed = list(tokens)
    changed[pos] = (changed[pos] + 1) % 2**32
    k0, k1 = chain_keys(NS1, tokens), chain_keys(NS1, changed)
    i = pos // 64
    assert k0[:i] == k1[:i]
    assert all(x != y for x, y in zip(k0[i:], k1[i:], strict=True))


@given(
    st.sampled_from(
        ["model_id", "model_revision", "kv_dtype", "tp_rank", "tenant", "block_tokens", "kv_heads"]
    ),
    st.lists(st.integers(0, 2**32 - 1), min_size=128, max_size=128),
)
def test_namespaces_never_share_keys(field: str, tokens: list[int]) -> None:
    alt = {
        "model_id": "other",
        "model_revision": "r2",
        "kv_dtype": "float16",
        "tp_rank": 1,
        "tenant": "t",
        "block_tokens": 32,
        "kv_heads": 4,
    }[field]
    d = NS1.to_dict() | {field: alt}
    if field == "tp_rank":
        d["tp_size"] = 2
    other = Namespace(**d)
    assert other.fingerprint != NS1.fingerprint
    assert not set(chain_keys(NS1, tokens)) & set(chain_keys(other, tokens))


def test_keys_do_not_depend_on_pythonhashseed() -> None:
    code = (
        "from kvstore.keys import Namespace, chain_keys;"
        "ns = Namespace('m', 'r', 'bfloat16', 'mha', (0, 1), 8, 128);"
        "print(chain_keys(ns, list(range(256)))[-1].hex())"
    )
    outs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"kv_dtype": "int3"},
        {"kv_layout": "gqa"},
        {"cached_layers": ()},
        {"cached_layers": (0, 0)},
        {"cached_layers": (-1,)},
        {"kv_heads": 0},
        {"tp_rank": 2},
        {"hash_alg": "md5"},
        {"model_id": ""},
        {"kv_layout": "mla"},  # mla needs kv_heads == 1
        {"head_dim": True},
    ],
)
def test_invalid_namespaces_are_rejected(overrides) -> None:
    with pytest.raises(InvalidArgument):
        Namespace(**(NS1.to_dict() | overrides))


def test_block_bytes_follow_the_payload_shape() -> None:
    assert NS1.payload_shape == (32, 2, 64, 8, 128)
    assert NS1.block_bytes == 32 * 2 * 64 * 8 * 128 * 2
    assert NS2.payload_shape == (3, 32, 576)
    assert NS2.block_bytes == 3 * 32 * 576
    assert Namespace.from_dict(NS2.to_dict()) == NS2
    assert Namespace(**(NS1.to_dict() | {"cached_layers": list(range(32))})) == NS1


@given(st.lists(st.one_of(st.binary(min_size=0, max_size=20), st.integers(), st.text(max_size=16))))
def test_check_keys_takes_exactly_16_byte_strings(items: list[object]) -> None:
    from kvstore.keys import KEY_BYTES, check_keys

    good = all(isinstance(k, bytes) and len(k) == KEY_BYTES for k in items)
    if good:
        assert check_keys(items) == items
    else:
        with pytest.raises(InvalidArgument):
            check_keys(items)


def test_check_keys_accepts_bytes_like_keys_as_bytes() -> None:
    from kvstore.keys import check_keys

    out = check_keys([bytearray(16), memoryview(b"m" * 16)])
    assert out == [bytes(16), b"m" * 16] and all(type(k) is bytes for k in out)
