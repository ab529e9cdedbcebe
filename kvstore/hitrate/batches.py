"""Requests as compact arrays: the one-pass engine's input.

A batch holds many requests' block keys as one ``uint64`` array (no Python object per
block), so memory is a few bytes per access in flight and nothing per access replayed.
Keys are folded to 64 bits here, once, by ``encode_keys``:

* integer ids in ``[0, 2**64)`` are their own key (exact);
* kv-cache-tester ids are scoped to their file as ``file << 40 | id`` when the id is below
  ``2**40`` and the file index below ``2**24`` (exact), else hashed with the file;
* 16-byte access-log chain keys fold as ``low64 ^ mix(high64)`` — exact for ids that differ
  in the low half (test keys), and for the daemon's hash-derived keys a collision needs two
  of ``n`` keys to meet in 64 bits (~``n**2 / 2**65``: 3e-4 at 1e8 distinct blocks).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request

BATCH_ACCESSES = 1 << 20
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
SCOPE_ID_BITS = 40


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a ``uint64`` array (the same as ``_hitrate.mix64``)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True, slots=True)
class AccessBatch:
    """Requests ``i`` = ``keys[offsets[i]:offsets[i+1]]`` at ``times_s[i]`` with
    ``lengths[i]`` input tokens, all of one block size."""

    keys: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len = requests + 1
    times_s: np.ndarray  # float64
    lengths: np.ndarray  # int64
    block_tokens: int

    @property
    def requests(self) -> int:
        return len(self.times_s)

    @property
    def accesses(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    def rows(self) -> Iterator[tuple[float, int, np.ndarray, int]]:
        """``(time_s, L, keys, B)`` per request (for merging files by time)."""
        o, k, b = self.offsets, self.keys, self.block_tokens
        for i, (t, n) in enumerate(zip(self.times_s.tolist(), self.lengths.tolist(), strict=True)):
            yield t, n, k[o[i] : o[i + 1]], b


Row = tuple[float, int, np.ndarray, int]


def encode_int_ids(ids: Sequence[int]) -> np.ndarray:
    """Integer ids as ``uint64`` keys: exact in ``[0, 2**64)``, hashed otherwise."""
    try:
        return np.array(ids, dtype=np.uint64)
    except (OverflowError, ValueError, TypeError):
        return np.array([_fold(k) for k in ids], dtype=np.uint64)


def scope_ids(ids: np.ndarray, file_index: int) -> np.ndarray:
    """File-local ids (int64) as run-wide keys (see the module docstring)."""
    if file_index < (1 << 24) and (len(ids) == 0 or (ids.min() >= 0 and ids.max() < (1 << 40))):
        return ids.astype(np.uint64) | np.uint64(file_index << SCOPE_ID_BITS)
    salt = mix64(np.array([file_index + 1], dtype=np.uint64))[0]
    return mix64(ids.astype(np.uint64) ^ salt) | np.uint64(1 << 63)


def fold_key16(flat: np.ndarray) -> np.ndarray:
    """``n x 16`` bytes (uint8) of chain keys as ``n`` 64-bit keys."""
    words = flat.reshape(-1, 16).view(">u8")  # big-endian halves: key(n) = n.to_bytes(16)
    hi = words[:, 0].astype(np.uint64)
    lo = words[:, 1].astype(np.uint64)
    return lo ^ np.where(hi == 0, np.uint64(0), mix64(hi))


def _fold(k: Hashable) -> int:
    if isinstance(k, bytes | bytearray) and len(k) == 16:
        return int(fold_key16(np.frombuffer(bytes(k), dtype=np.uint8))[0])
    if isinstance(k, int) and 0 <= k < (1 << 64):
        return k
    if isinstance(k, int):
        return int(mix64(np.array([k & ((1 << 64) - 1)], dtype=np.uint64))[0])
    raise ConfigError(f"block keys of type {type(k).__name__} are not supported")


def encode_keys(keys: Sequence[Hashable]) -> np.ndarray:
    """Any reader's keys (ints or 16-byte chain keys) as ``uint64``."""
    if not keys:
        return np.empty(0, dtype=np.uint64)
    if isinstance(keys, np.ndarray):
        return keys.astype(np.uint64, copy=False)
    if isinstance(keys[0], int):
        return encode_int_ids(keys)  # type: ignore[arg-type]
    return np.array([_fold(k) for k in keys], dtype=np.uint64)


def rows_of(requests: Iterable[Request]) -> Iterator[Row]:
    for r in requests:
        yield r.time_s, r.input_tokens, encode_keys(r.keys), r.block_tokens


class BatchBuilder:
    """Packs rows into batches of about ``BATCH_ACCESSES`` accesses (a block-size change
    closes the batch; the engine then refuses it, as the simulator does)."""

    def __init__(self, accesses: int = BATCH_ACCESSES) -> None:
        self._limit = accesses
        self._keys: list[np.ndarray] = []
        self._times: list[float] = []
        self._lengths: list[int] = []
        self._n = 0
        self._b = 0

    def add(self, t: float, big_l: int, keys: np.ndarray, b: int) -> AccessBatch | None:
        out = None
        if b != self._b and self._times:
            out = self.flush()
        self._b = b
        self._keys.append(keys)
        self._times.append(t)
        self._lengths.append(big_l)
        self._n += len(keys)
        if self._n >= self._limit and out is None:
            out = self.flush()
        return out

    def flush(self) -> AccessBatch | None:
        if not self._times:
            return None
        lens = np.fromiter((len(k) for k in self._keys), dtype=np.int64, count=len(self._keys))
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        batch = AccessBatch(
            keys=np.concatenate(self._keys).astype(np.uint64, copy=False),
            offsets=offsets,
            times_s=np.array(self._times, dtype=np.float64),
            lengths=np.array(self._lengths, dtype=np.int64),
            block_tokens=self._b,
        )
        self._keys, self._times, self._lengths, self._n = [], [], [], 0
        return batch


def batches_of(rows: Iterable[Row], accesses: int = BATCH_ACCESSES) -> Iterator[AccessBatch]:
    builder = BatchBuilder(accesses)
    for row in rows:
        out = builder.add(*row)
        if out is not None:
            yield out
    last = builder.flush()
    if last is not None:
        yield last
