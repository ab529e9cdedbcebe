"""Trace block ids → store namespaces and 16-byte keys.

Block identity in a trace is its id (``hash_ids``), scoped to the trace's namespace
(DESIGN §10: all Mooncake inputs share one; each kv-cache-tester session file is its own).
The simulator treats equal ids as the same block wherever they occur, so the key of a block
is derived from its id alone, not chained over the ids before it:

    key = xxh3_128(namespace fingerprint ‖ encode(id))

``encode`` is ``b"i"`` + the id as 16-byte little-endian two's complement for integers in
range, ``b"s"`` + its decimal text for larger ones, and ``b"b"`` + the bytes for the access
log's 16-byte keys. Equal ids map to equal keys and distinct ids to distinct keys, so equal
trace prefixes are equal key prefixes and the store sees exactly the blocks the simulator
models. Keys depend only on the file (its base name) and the flags, never on which other
files are in the run, so any process can recompute them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable, Sequence

import xxhash

from kvstore.errors import IntegrityError
from kvstore.keys import Key, Namespace
from kvstore.loadgen.errors import LoadgenError

_I128 = 1 << 127
MODEL_PREFIX = "loadgen/"


#: The largest block a load may make (``block_tokens × bytes_per_token``): 1 MiB a token at
#: 64 tokens, past any real model's KV; beyond it a replay only exhausts memory.
MAX_BLOCK_BYTES = 64 << 20


def encode_id(block_id: Hashable) -> bytes:
    if isinstance(block_id, bool):
        raise LoadgenError(f"block id {block_id!r} is not an integer or bytes")
    if isinstance(block_id, int):
        if -_I128 <= block_id < _I128:
            return b"i" + block_id.to_bytes(16, "little", signed=True)
        return b"s" + str(block_id).encode()
    if isinstance(block_id, bytes | bytearray | memoryview):
        return b"b" + bytes(block_id)
    raise LoadgenError(f"block id {block_id!r} is not an integer or bytes")


def block_key(ns: Namespace, block_id: Hashable) -> Key:
    return xxhash.xxh3_128_digest(ns.fingerprint + encode_id(block_id))


def namespace_for(
    scope: str, block_tokens: int, bytes_per_token: int, tenant: str = ""
) -> Namespace:
    """One ``mla`` layer of ``bytes_per_token`` uint8 per token: ``block_bytes`` is exactly
    ``block_tokens × bytes_per_token``."""
    return Namespace(
        model_id=MODEL_PREFIX + scope,
        model_revision="trace",
        kv_dtype="uint8",
        kv_layout="mla",
        cached_layers=(0,),
        kv_heads=1,
        head_dim=bytes_per_token,
        block_tokens=block_tokens,
        tenant=tenant,
    )


class KeyMapper:
    """Namespaces and keys of one run's inputs (``paths`` in the reader's file order).

    ``scoped`` formats (kv-cache-tester) give each file its own namespace; the reader's
    file-scoped ids ``id × files + index`` are turned back into the file's own ids so a
    file's keys do not depend on the rest of the run.
    """

    def __init__(
        self, fmt: str, paths: Sequence[str], bytes_per_token: int, tenant: str = ""
    ) -> None:
        if bytes_per_token < 1:
            raise LoadgenError(
                f"--bytes-per-token must be a positive integer, got {bytes_per_token}"
            )
        self.fmt = fmt
        self.per_file = fmt == "kv-cache-tester"
        self.paths = list(paths)
        self.bytes_per_token = bytes_per_token
        self.tenant = tenant
        self._scopes = self._scope_names()
        self._namespaces: dict[tuple[int, int], Namespace] = {}
        self._lock = threading.Lock()

    def _scope_names(self) -> list[str]:
        if not self.per_file:
            return [self.fmt]
        names: list[str] = []
        seen: set[str] = set()
        for p in self.paths:
            base = os.path.basename(p)
            name = base if base not in seen else f"{base}#{len(names)}"
            seen.add(name)
            names.append(name)
        return names

    def namespace(self, file_index: int, block_tokens: int) -> Namespace:
        scope = file_index if self.per_file else 0
        with self._lock:
            ns = self._namespaces.get((scope, block_tokens))
            if ns is None:
                if block_tokens * self.bytes_per_token > MAX_BLOCK_BYTES:
                    raise LoadgenError(
                        f"--bytes-per-token {self.bytes_per_token} makes {block_tokens}-token "
                        f"blocks of {block_tokens * self.bytes_per_token} bytes; at most "
                        f"{MAX_BLOCK_BYTES >> 20} MiB a block"
                    )
                ns = namespace_for(
                    self._scopes[scope], block_tokens, self.bytes_per_token, self.tenant
                )
                self._namespaces[(scope, block_tokens)] = ns
            return ns

    def namespaces(self) -> list[Namespace]:
        with self._lock:
            return list(self._namespaces.values())

    def check_integrity(self) -> None:
        """Every namespace handed out has the block size its key says, and no two scopes
        share a namespace (which would merge blocks the model keeps apart)."""
        with self._lock:
            items = list(self._namespaces.items())
        for (scope, b), ns in items:
            if ns.block_tokens != b or ns.block_bytes != b * self.bytes_per_token:
                raise IntegrityError(f"keymap: namespace {ns.model_id} has the wrong block size")
            if ns.model_id != MODEL_PREFIX + self._scopes[scope]:
                raise IntegrityError(f"keymap: scope {scope} maps to {ns.model_id}")
        if len({ns.fingerprint for _, ns in items}) != len(items):
            raise IntegrityError("keymap: two scopes share a namespace")

    def keys(self, ns: Namespace, ids: Sequence[Hashable]) -> list[Key]:
        fp = ns.fingerprint
        h = xxhash.xxh3_128_digest
        if self.per_file:
            stride = len(self.paths)
            return [h(fp + encode_id(i // stride)) for i in ids]  # type: ignore[operator]
        return [h(fp + encode_id(i)) for i in ids]
