"""The deployment's prefix key (``kvstore.prefix_key``) and keyed chain keys (DESIGN §3):
golden vectors, one process against another, the secret kept out of the namespace, and the
key files refused."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace, chain_keys
from kvstore.prefix_key import XXH3, PrefixHash, load_prefix_key

REPO = Path(__file__).resolve().parents[2]
NS = Namespace("m", "r", "bfloat16", "mha", (0, 1), 2, 8, block_tokens=4, tenant="alice")
SECRET = bytes(range(32))
TOKENS = list(range(100, 112))  # three blocks of 4
#: blake2b_128 keyed with SECRET over NS's fingerprint, then TOKENS' blocks (pinned: a
#: change of the key format must be deliberate, as for xxh3's golden vectors).
GOLDEN = [
    "6138236a6dfdf26b715e5c1f6daa4fdf",
    "a5ffa100f6725dd2090935ebdc6772d6",
    "c5a8903233caa2eb2e65ab50f64e63ce",
]


def keyed(ns: Namespace = NS, secret: bytes = SECRET) -> Namespace:
    return PrefixHash("blake2b_128", secret).apply(ns)


def test_golden_vectors() -> None:
    assert [k.hex() for k in chain_keys(keyed(), TOKENS)] == GOLDEN
    # k_1 re-derived from the spec's words alone (hashlib, struct), not through kvstore.keys
    root = hashlib.blake2b(keyed().fingerprint, digest_size=16, key=SECRET).digest()
    block = struct.pack("<4I", *TOKENS[:4])
    assert hashlib.blake2b(root + block, digest_size=16, key=SECRET).hexdigest() == GOLDEN[0]


def test_another_process_computes_the_same_keys() -> None:
    code = (
        "from kvstore.keys import Namespace, chain_keys\n"
        "from kvstore.prefix_key import PrefixHash\n"
        "ns = Namespace('m', 'r', 'bfloat16', 'mha', (0, 1), 2, 8, block_tokens=4, "
        "tenant='alice')\n"
        "ns = PrefixHash('blake2b_128', bytes(range(32))).apply(ns)\n"
        "print(' '.join(k.hex() for k in chain_keys(ns, list(range(100, 112)))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.split()
    assert out == GOLDEN


@settings(max_examples=50, deadline=None)
@given(
    st.binary(min_size=16, max_size=64),
    st.binary(min_size=16, max_size=64),
    st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=16),
)
def test_keys_differ_with_the_secret_and_equal_the_explicit_secret(
    a: bytes, b: bytes, tokens: list[int]
) -> None:
    ka, kb = chain_keys(keyed(secret=a), tokens), chain_keys(keyed(secret=b), tokens)
    assert ka == chain_keys(keyed(), tokens, secret=a)  # the namespace's secret is the one used
    if a != b:
        assert all(x != y for x, y in zip(ka, kb, strict=True))
    assert all(x != y for x, y in zip(ka, chain_keys(NS, tokens), strict=True))  # not xxh3


def test_the_secret_is_not_a_namespace_field() -> None:
    ns = keyed()
    plain = dataclasses.replace(NS, hash_alg="blake2b_128")
    assert ns == plain and ns.fingerprint == plain.fingerprint  # the daemon's view
    assert "prefix_secret" not in ns.to_dict() and SECRET.hex() not in repr(ns)
    assert SECRET not in ns.field_values()
    with pytest.raises(InvalidArgument, match="unknown namespace fields"):
        Namespace.from_dict({**ns.to_dict(), "prefix_secret": SECRET})
    # Derived namespaces (a request's tenant, bounded replay's layers) keep it.
    derived = dataclasses.replace(ns, tenant="bob", cached_layers=(1,))
    assert derived.prefix_secret == SECRET
    assert PrefixHash.of(derived) == PrefixHash("blake2b_128", SECRET)
    with pytest.raises(InvalidArgument, match="blake2b_128 only"):
        dataclasses.replace(NS, prefix_secret=SECRET)  # xxh3 with a secret: a mistake
    with pytest.raises(InvalidArgument, match="need a secret"):
        PrefixHash("blake2b_128")
    assert XXH3.apply(NS) is NS


def write(tmp_path: Path, data: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "prefix.key"
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_key_files_hex_or_raw(tmp_path: Path) -> None:
    assert load_prefix_key(write(tmp_path, SECRET.hex().encode() + b"\n")) == SECRET
    assert load_prefix_key(write(tmp_path, SECRET, 0o640)) == SECRET  # group may read
    raw = b"\n" + SECRET[1:] + b"\n"  # raw bytes are taken as they are, newlines included
    assert load_prefix_key(write(tmp_path, raw)) == raw


@pytest.mark.parametrize(
    ("data", "mode", "message"),
    [
        (SECRET, 0o644, "readable by every user .mode 644.: chmod 600"),
        (SECRET, 0o604, "readable by every user"),
        (b"0123456789abcdef\n", 0o600, "8 bytes of key, need 16 to 64"),  # hex: 8 bytes
        (b"short", 0o600, "5 bytes of key, need 16 to 64 .make one with: openssl rand"),
        (b"", 0o600, "0 bytes of key"),
        (bytes(65), 0o600, "65 bytes of key"),
    ],
)
def test_bad_key_files_are_refused(tmp_path: Path, data: bytes, mode: int, message: str) -> None:
    path = write(tmp_path, data, mode)
    with pytest.raises(InvalidArgument, match=message) as e:
        load_prefix_key(path)
    assert path in str(e.value) and "\n" not in str(e.value)


def test_missing_key_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="No such file"):
        load_prefix_key(str(tmp_path / "absent"))
    with pytest.raises(InvalidArgument, match=r"Is a directory|not a regular file"):
        load_prefix_key(str(tmp_path))
