"""Namespaces and prefix-chained block keys (DESIGN §3, normative).

A key names one full block of ``block_tokens`` tokens *and everything before it*:
``k_i = H(k_{i-1} ‖ t_i)`` with ``k_0 = H(fingerprint)``. Two prompts that share their
first ``i`` blocks share ``k_1 … k_i`` and nothing after; two namespaces (other model,
dtype, layout, TP rank, tenant…) never share a key because the root differs.

Keys must be identical across processes, machines and languages, so everything is
spelled in bytes: msgpack for the namespace fields, little-endian uint32 for tokens,
big-endian digests. No ``hash()``, no pickle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np
import xxhash

from kvstore.errors import InvalidArgument, InvalidTokens

KEY_BYTES = 16
MAX_TOKEN_ID = 2**32 - 1

#: Bytes per element of each supported ``kv_dtype``.
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
}
KV_LAYOUTS = ("mha", "mla")
HASH_ALGS = ("xxh3_128", "blake2b_128")

Key = bytes


@dataclass(frozen=True)
class Namespace:
    """Everything that makes two KV blocks of the same tokens interchangeable.

    Field order is part of the key format: the fingerprint is computed over the fields
    in declaration order. ``mha`` stores per cached layer K and V of
    ``[block_tokens, kv_heads, head_dim]``; ``mla`` stores one latent of
    ``[block_tokens, head_dim]`` per cached layer (``head_dim`` is the latent width and
    ``kv_heads`` must be 1).
    """

    model_id: str
    model_revision: str
    kv_dtype: str
    kv_layout: str
    cached_layers: tuple[int, ...]
    kv_heads: int
    head_dim: int
    block_tokens: int = 64
    tp_rank: int = 0
    tp_size: int = 1
    hash_alg: str = "xxh3_128"
    tenant: str = ""
    #: The deployment secret of ``blake2b_128`` chain keys (``kvstore.prefix_key``): not a
    #: namespace field — not in the fingerprint, ``to_dict``, the wire or equality — so the
    #: daemon never sees it; an init field only so that ``dataclasses.replace`` keeps it.
    prefix_secret: bytes | None = field(default=None, repr=False, compare=False, kw_only=True)
    # Derived once; excluded from equality so two equal field sets compare equal.
    _fingerprint: bytes = field(init=False, repr=False, compare=False, default=b"")
    _block_bytes: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        layers = self.cached_layers
        if not isinstance(layers, tuple):
            if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
                raise InvalidArgument("cached_layers must be a sequence of layer indices")
            object.__setattr__(self, "cached_layers", tuple(layers))
        _check_namespace(self)
        object.__setattr__(self, "_fingerprint", fingerprint_of(self))
        # Asked on every read and write; computing it each time was ~0.3 µs of a read.
        n = DTYPE_BYTES[self.kv_dtype]
        for dim in self.payload_shape:
            n *= dim
        object.__setattr__(self, "_block_bytes", n)

    @property
    def fingerprint(self) -> bytes:
        """16-byte namespace fingerprint (xxh3-128 of the msgpack'd fields)."""
        return self._fingerprint

    @property
    def payload_shape(self) -> tuple[int, ...]:
        """Shape of one block's payload in ``kv_dtype`` elements (DESIGN §4)."""
        n = len(self.cached_layers)
        if self.kv_layout == "mha":
            return (n, 2, self.block_tokens, self.kv_heads, self.head_dim)
        return (n, self.block_tokens, self.head_dim)

    @property
    def block_bytes(self) -> int:
        """Payload bytes of one block (the header is not included)."""
        return self._block_bytes

    def field_values(self) -> list[Any]:
        """The fields in their normative order (what the fingerprint hashes)."""
        return [
            list(v) if isinstance(v, tuple) else v
            for v in (getattr(self, name) for name in _field_names(self))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _field_names(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Namespace:
        known = set(_field_names(cls))
        unknown = set(d) - known
        if unknown:
            raise InvalidArgument(f"unknown namespace fields: {sorted(unknown)}")
        return cls(**d)


def _field_names(ns: Namespace | type[Namespace]) -> list[str]:
    """The normative fields, in order (the secret is not one)."""
    return [f.name for f in fields(ns) if f.init and f.name != "prefix_secret"]


def _check_namespace(ns: Namespace) -> None:
    for name in ("model_id", "model_revision", "kv_dtype", "kv_layout", "hash_alg", "tenant"):
        if not isinstance(getattr(ns, name), str):
            raise InvalidArgument(f"namespace field {name} must be a string")
    if not ns.model_id:
        raise InvalidArgument("namespace model_id must not be empty")
    if ns.kv_dtype not in DTYPE_BYTES:
        raise InvalidArgument(f"unknown kv_dtype {ns.kv_dtype!r}; known: {sorted(DTYPE_BYTES)}")
    if ns.kv_layout not in KV_LAYOUTS:
        raise InvalidArgument(f"unknown kv_layout {ns.kv_layout!r}; known: {KV_LAYOUTS}")
    if ns.hash_alg not in HASH_ALGS:
        raise InvalidArgument(f"unknown hash_alg {ns.hash_alg!r}; known: {HASH_ALGS}")
    if ns.prefix_secret is not None:
        if ns.hash_alg != "blake2b_128" or not isinstance(ns.prefix_secret, bytes):
            raise InvalidArgument("a prefix secret (bytes) goes with hash_alg blake2b_128 only")
        if not 0 < len(ns.prefix_secret) <= 64:
            raise InvalidArgument("blake2b secret must be 1 to 64 bytes")
    ints = ("kv_heads", "head_dim", "block_tokens", "tp_rank", "tp_size")
    for name in ints:
        v = getattr(ns, name)
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidArgument(f"namespace field {name} must be an integer")
    if not ns.cached_layers:
        raise InvalidArgument("cached_layers must name at least one layer")
    if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ns.cached_layers):
        raise InvalidArgument("cached_layers must be non-negative integers")
    if len(set(ns.cached_layers)) != len(ns.cached_layers):
        raise InvalidArgument("cached_layers must not repeat a layer")
    if min(ns.kv_heads, ns.head_dim, ns.block_tokens, ns.tp_size) < 1:
        raise InvalidArgument("kv_heads, head_dim, block_tokens and tp_size must be >= 1")
    if not 0 <= ns.tp_rank < ns.tp_size:
        raise InvalidArgument(f"tp_rank {ns.tp_rank} outside [0, tp_size={ns.tp_size})")
    if ns.kv_layout == "mla" and ns.kv_heads != 1:
        raise InvalidArgument("mla namespaces store one latent per layer: kv_heads must be 1")


def fingerprint_of(ns: Namespace) -> bytes:
    packed = msgpack.packb(ns.field_values(), use_bin_type=True)
    return xxhash.xxh3_128(packed).digest()


def _hasher(ns: Namespace, secret: bytes | None) -> Callable[[bytes], bytes]:
    if ns.hash_alg == "xxh3_128":
        return xxhash.xxh3_128_digest
    if not secret:
        raise InvalidArgument("hash_alg blake2b_128 needs a deployment secret")
    if len(secret) > 64:
        raise InvalidArgument("blake2b secret must be at most 64 bytes")
    key = bytes(secret)

    def blake(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=16, key=key).digest()

    return blake


def tokens_to_le_u32(tokens: Any) -> memoryview:
    """Token ids as little-endian uint32 bytes; raises ``InvalidTokens`` if out of range.

    Accepts a list/tuple of ints, a numpy array or a torch tensor (any integer dtype).
    """
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # torch.Tensor, without importing
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        try:
            arr = np.asarray(tokens)
        except (OverflowError, ValueError, TypeError) as e:
            raise InvalidTokens(f"token ids must be integers in [0, 2**32): {e}") from None
    if arr.ndim != 1:
        raise InvalidTokens(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return memoryview(b"")
    if arr.dtype.kind not in "iu":
        raise InvalidTokens(f"token ids must be integers in [0, 2**32), got dtype {arr.dtype}")
    if arr.dtype != np.dtype("<u4"):
        # A single min/max pass is far cheaper than hashing, and it is what makes an
        # out-of-range id an error instead of a silent wrap-around.
        if arr.min() < 0 or (
            (arr.dtype.itemsize > 4 or arr.dtype.kind == "i") and arr.max() > MAX_TOKEN_ID
        ):
            raise InvalidTokens("token ids must be integers in [0, 2**32)")
        arr = arr.astype("<u4")
    return np.ascontiguousarray(arr).data.cast("B")


def chain_keys(ns: Namespace, tokens: Any, *, secret: bytes | None = None) -> list[Key]:
    """Keys ``[k_1 … k_n]`` of the ``n = len(tokens) // block_tokens`` full blocks;
    ``blake2b_128`` keys use ``secret``, else the namespace's ``prefix_secret``."""
    data = tokens_to_le_u32(tokens)
    h = _hasher(ns, secret if secret is not None else ns.prefix_secret)
    stride = ns.block_tokens * 4
    n = len(data) // stride
    prev = h(ns.fingerprint)
    out: list[Key] = []
    append = out.append
    # bytes + memoryview concatenates without an intermediate copy of the slice object.
    for off in range(0, n * stride, stride):
        prev = h(prev + data[off : off + stride])
        append(prev)
    return out


def chain_root(ns: Namespace, *, secret: bytes | None = None) -> bytes:
    """``r = H(fingerprint)``: never stored, exposed for cross-language golden tests."""
    return _hasher(ns, secret if secret is not None else ns.prefix_secret)(ns.fingerprint)


def check_keys(keys: Sequence[Any]) -> list[Key]:
    """``keys`` as a list of ``bytes``, each ``KEY_BYTES`` long (``bytes``, ``bytearray`` or
    ``memoryview`` accepted); anything else raises ``InvalidArgument``. The one key check of
    every tier and server: a misuse is refused before anything is stored."""
    out: list[Key] = []
    for k in keys:
        if type(k) is bytes and len(k) == KEY_BYTES:  # the common case, at no copy
            out.append(k)
            continue
        if not isinstance(k, bytes | bytearray | memoryview) or len(k) != KEY_BYTES:
            got = f"{len(k)} bytes" if isinstance(k, bytes | bytearray | memoryview) else type(k)
            raise InvalidArgument(f"keys must be {KEY_BYTES}-byte strings, got {got}")
        out.append(bytes(k))
    return out
