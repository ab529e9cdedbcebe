"""The stored-block encoding (DESIGN §4, normative): a 64-byte header + payload.

Every stored or transmitted block carries its namespace fingerprint, its key, its
length and an xxh3-64 of its payload, so a reader can prove that the bytes it is about
to hand to an engine are the bytes that were written *for that key* — a stale slot, a
misdirected write or a flipped bit become a miss, never wrong KV.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from kvstore.errors import (
    BlockChecksumError,
    BlockFingerprintError,
    BlockKeyError,
    BlockLengthError,
    BlockMagicError,
    BlockTruncatedError,
    BlockVersionError,
)

MAGIC = b"KVB1"
FORMAT_VERSION = 1
HEADER_BYTES = 64
# magic, version, flags, fingerprint, key, payload length, xxh3-64, created-at µs
_HEADER = struct.Struct("<4sHH16s16sQQQ")
assert _HEADER.size == HEADER_BYTES


@dataclass(frozen=True, slots=True)
class BlockHeader:
    fingerprint: bytes
    key: bytes
    payload_len: int
    checksum: int
    created_at_us: int
    version: int = FORMAT_VERSION
    flags: int = 0

    def pack(self) -> bytes:
        return _HEADER.pack(
            MAGIC,
            self.version,
            self.flags,
            self.fingerprint,
            self.key,
            self.payload_len,
            self.checksum,
            self.created_at_us,
        )


def payload_checksum(payload: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(payload)


def now_us() -> int:
    return time.time_ns() // 1000


def make_header(
    fingerprint: bytes,
    key: bytes,
    payload: bytes | bytearray | memoryview,
    created_at_us: int | None = None,
    checksum: int | None = None,
) -> BlockHeader:
    """The header of ``payload``. ``checksum`` is the xxh3-64 made when the block was first
    committed, carried with it since (DESIGN §4: end to end); ``None`` computes it now."""
    if len(fingerprint) != 16 or len(key) != 16:
        raise ValueError("fingerprint and key must be 16 bytes each")
    return BlockHeader(
        fingerprint=bytes(fingerprint),
        key=bytes(key),
        payload_len=len(memoryview(payload).cast("B")),
        checksum=payload_checksum(payload) if checksum is None else checksum,
        created_at_us=now_us() if created_at_us is None else created_at_us,
    )


def encode_block(
    fingerprint: bytes,
    key: bytes,
    payload: bytes | bytearray | memoryview,
    created_at_us: int | None = None,
    checksum: int | None = None,
) -> bytes:
    """Header + payload as one ``bytes`` (the wire and on-disk encoding)."""
    header = make_header(fingerprint, key, payload, created_at_us, checksum)
    return header.pack() + bytes(payload)


def encode_block_into(
    out: memoryview,
    fingerprint: bytes,
    key: bytes,
    payload: bytes | bytearray | memoryview,
    created_at_us: int | None = None,
    checksum: int | None = None,
) -> int:
    """Encode into ``out`` (at least 64 + len(payload) bytes); returns the bytes written."""
    pl = memoryview(payload).cast("B")
    total = HEADER_BYTES + len(pl)
    if len(out) < total:
        raise ValueError(f"output buffer of {len(out)} bytes cannot hold a {total}-byte block")
    out[:HEADER_BYTES] = make_header(fingerprint, key, pl, created_at_us, checksum).pack()
    out[HEADER_BYTES:total] = pl
    return total


def decode_header(buf: bytes | bytearray | memoryview) -> BlockHeader:
    """Parse and check magic and version; the rest is checked by ``verify_block``."""
    if len(buf) < HEADER_BYTES:
        raise BlockTruncatedError(f"block of {len(buf)} bytes is shorter than its header")
    magic, version, flags, fp, key, plen, csum, created = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BlockMagicError(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise BlockVersionError(f"unsupported block format version {version}")
    if flags != 0:
        # Version 1 defines no flags: a set bit means a writer we do not understand.
        raise BlockVersionError(f"unsupported block flags {flags:#x}")
    return BlockHeader(fp, key, plen, csum, created, version, flags)


def check_header(
    buf: bytes | bytearray | memoryview,
    *,
    fingerprint: bytes,
    key: bytes,
    payload_len: int | None = None,
) -> tuple[memoryview, int]:
    """Check every header field of an encoded block; return a view of its payload and the
    checksum the payload must have. The payload itself is not hashed: a reader copies it
    to its destination first and checks the copy (``verify_rows``), so the check covers
    the bytes its caller gets.

    Raises one ``BlockError`` subclass per kind of mismatch, checked in the order of the
    header (magic, version, fingerprint, key, length), so tests and counters can tell a
    stale slot (key) from a flipped bit (checksum).
    """
    mv = memoryview(buf).cast("B")
    plen, csum = check_header_fields(mv, fingerprint=fingerprint, key=key, payload_len=payload_len)
    end = HEADER_BYTES + plen
    if len(mv) < end:
        raise BlockTruncatedError(f"block of {len(mv)} bytes, header says {end}")
    return mv[HEADER_BYTES:end], csum


def check_header_fields(
    header: bytes | bytearray | memoryview,
    *,
    fingerprint: bytes,
    key: bytes,
    payload_len: int | None = None,
) -> tuple[int, int]:
    """``check_header`` for a header stored apart from its payload (the SSD tier keeps a
    page-sized payload on its own page): returns (payload length, checksum)."""
    if len(header) < HEADER_BYTES:
        raise BlockTruncatedError(f"block of {len(header)} bytes is shorter than its header")
    # Unpacked in place rather than through decode_header: this runs once per block on
    # every read path, and building a header object is a visible share of its cost.
    magic, version, flags, fp, hkey, plen, csum, _ = _HEADER.unpack_from(header, 0)
    if magic != MAGIC:
        raise BlockMagicError(f"bad magic {magic!r}")
    if version != FORMAT_VERSION or flags != 0:
        decode_header(header)  # raises the precise version/flags error
    if fp != fingerprint:
        raise BlockFingerprintError("block belongs to another namespace")
    if hkey != key:
        raise BlockKeyError(f"block holds key {hkey.hex()}, expected {key.hex()}")
    if payload_len is not None and plen != payload_len:
        raise BlockLengthError(f"payload length {plen}, expected {payload_len}")
    return plen, csum


def verify_block(
    buf: bytes | bytearray | memoryview,
    *,
    fingerprint: bytes,
    key: bytes,
    payload_len: int | None = None,
) -> memoryview:
    """``check_header`` plus the payload's checksum, in place; return a view of the payload."""
    payload, csum = check_header(buf, fingerprint=fingerprint, key=key, payload_len=payload_len)
    if xxhash.xxh3_64_intdigest(payload) != csum:
        raise BlockChecksumError(f"payload checksum mismatch for key {key.hex()}")
    return payload


def verify_rows(rows: memoryview, block_bytes: int, checksums: Sequence[int]) -> int:
    """How many leading rows of ``rows`` (``block_bytes`` each) match ``checksums``.

    The receiving end of every transfer calls this on its destination after the copy, so
    what is checked is what its caller gets: the first row that fails ends the prefix
    there, and the caller counts it as a corrupt block (a miss, never data).
    """
    digest = xxhash.xxh3_64_intdigest
    n = min(len(checksums), len(rows) // block_bytes) if block_bytes else 0
    for i in range(n):
        if digest(rows[i * block_bytes : (i + 1) * block_bytes]) != checksums[i]:
            return i
    return n
