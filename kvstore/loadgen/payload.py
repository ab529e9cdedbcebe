"""Deterministic block payloads: any process regenerates a block's bytes from its identity.

    pad(ns)[16j : 16j+16] = xxh3_128(b"kvstore-loadgen-pad" ‖ fingerprint ‖ u64le(j))
    payload(ns, key)[i]   = pad(ns)[i] XOR key[i mod 16]

Why this shape: the pad is random-looking and position-dependent, so a shifted, truncated
or zeroed row fails; the key term differs between blocks, so a row served under another
key (a swapped slot, an aliased block, another namespace's data) fails too. Generation and
checking are one vectorised XOR per batch of rows, far cheaper than the I/O they check.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from kvstore.keys import Key, Namespace

_PAD_TAG = b"kvstore-loadgen-pad"


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One block whose bytes differ from what its key says they must be."""

    index: int  # row in the batch checked
    key: Key
    wrong_bytes: int
    first_offset: int


class PayloadMaker:
    """Pads are computed once per namespace and shared by every thread (read-only)."""

    def __init__(self) -> None:
        self._pads: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()

    def pad(self, ns: Namespace) -> np.ndarray:
        pad = self._pads.get(ns.fingerprint)
        if pad is None:
            bb = ns.block_bytes
            words = (bb + 15) // 16
            prefix = _PAD_TAG + ns.fingerprint
            raw = b"".join(
                xxhash.xxh3_128_digest(prefix + j.to_bytes(8, "little")) for j in range(words)
            )
            pad = np.frombuffer(raw, dtype=np.uint8)[:bb].copy()
            pad.flags.writeable = False
            with self._lock:
                self._pads.setdefault(ns.fingerprint, pad)
        return pad

    def rows(self, ns: Namespace, keys: Sequence[Key]) -> np.ndarray:
        """``len(keys) × block_bytes`` uint8, row ``i`` the payload of ``keys[i]``."""
        pad = self.pad(ns)
        bb = pad.shape[0]
        n = len(keys)
        if n == 0:
            return np.empty((0, bb), dtype=np.uint8)
        k = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, 16)
        reps = (bb + 15) // 16
        tiled = np.tile(k, (1, reps))
        if tiled.shape[1] != bb:
            tiled = np.ascontiguousarray(tiled[:, :bb])
        np.bitwise_xor(tiled, pad, out=tiled)
        return tiled

    def check(self, ns: Namespace, keys: Sequence[Key], got: np.ndarray) -> list[Mismatch]:
        """Compare ``got`` (rows of the blocks of ``keys``) with their payloads."""
        if len(keys) == 0:
            return []
        want = self.rows(ns, keys)
        got = got.reshape(want.shape)
        if np.array_equal(got, want):
            return []
        diff = got != want
        out = []
        for i in np.flatnonzero(diff.any(axis=1)):
            row = diff[i]
            out.append(Mismatch(int(i), keys[int(i)], int(row.sum()), int(np.argmax(row))))
        return out
