"""Translation between kvstore objects and protocol messages (DESIGN §4, §7).

Shared by the clients and the daemon so both ends cut and reassemble blocks the same
way: an encoded block (64-byte header + payload) is sent as chunks of at most
``CHUNK_BYTES``, in order; the receiver writes the payload bytes straight into the
destination row and verifies the header and checksum when the last chunk arrives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore import keys as keys_mod
from kvstore.block import HEADER_BYTES, decode_header, make_header, payload_checksum
from kvstore.errors import BlockError, InvalidArgument
from kvstore.keys import Key, Namespace
from kvstore.wire.proto import kvstore_pb2 as pb

CHUNK_BYTES = 1 << 20
#: Keys one request may name (a chain of 2M tokens at 64 tokens a block). Clients refuse
#: more before sending; daemons and nodes refuse more too (``ServerLimits``).
MAX_KEYS_PER_REQUEST = 1 << 15
#: Wire bytes per key of the largest request (``CommitStaged`` naming every key: the key
#: field, a packed index and a 64-byte header field, each with its tag and length).
_WIRE_BYTES_PER_KEY = (2 + 16) + 5 + (2 + 64)
#: gRPC message limit on both ends: one chunk, or a request at the key limit, plus the
#: namespace and framing. The limits agree, so a request within the key limit is never
#: refused for its size (that would read as an overloaded daemon, not as misuse).
MAX_MESSAGE_BYTES = max(CHUNK_BYTES, MAX_KEYS_PER_REQUEST * _WIRE_BYTES_PER_KEY) + (64 << 10)
#: The access log stores ``prompt_tokens`` as int64 (DESIGN §8); both ends refuse more.
MAX_PROMPT_TOKENS = (1 << 63) - 1

_TO_PROTO: dict[str, Any] = {"dram": pb.DURABILITY_DRAM, "ssd": pb.DURABILITY_SSD}
_FROM_PROTO: dict[int, str] = {int(v): k for k, v in _TO_PROTO.items()}


def ns_to_proto(ns: Namespace) -> pb.NamespaceSpec:
    return pb.NamespaceSpec(
        model_id=ns.model_id,
        model_revision=ns.model_revision,
        kv_dtype=ns.kv_dtype,
        kv_layout=ns.kv_layout,
        cached_layers=list(ns.cached_layers),
        kv_heads=ns.kv_heads,
        head_dim=ns.head_dim,
        block_tokens=ns.block_tokens,
        tp_rank=ns.tp_rank,
        tp_size=ns.tp_size,
        hash_alg=ns.hash_alg,
        tenant=ns.tenant,
        fingerprint=ns.fingerprint,
    )


def ns_from_proto(spec: pb.NamespaceSpec) -> Namespace:
    """Rebuild and validate a namespace; a stated fingerprint must match ours."""
    ns = Namespace(
        model_id=spec.model_id,
        model_revision=spec.model_revision,
        kv_dtype=spec.kv_dtype,
        kv_layout=spec.kv_layout,
        cached_layers=tuple(spec.cached_layers),
        kv_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        block_tokens=spec.block_tokens,
        tp_rank=spec.tp_rank,
        tp_size=spec.tp_size,
        hash_alg=spec.hash_alg,
        tenant=spec.tenant,
    )
    if spec.fingerprint and spec.fingerprint != ns.fingerprint:
        raise InvalidArgument("namespace fingerprint does not match its fields")
    return ns


def check_keys(keys: Sequence[bytes], limit: int = MAX_KEYS_PER_REQUEST) -> list[Key]:
    if len(keys) > limit:
        raise InvalidArgument(f"{len(keys)} keys exceed the limit of {limit} per request")
    return keys_mod.check_keys(keys)


def durability_to_proto(d: str) -> Any:
    try:
        return _TO_PROTO[d]
    except KeyError:
        raise InvalidArgument(f"durability must be 'dram' or 'ssd', got {d!r}") from None


def durability_from_proto(v: int) -> str:
    try:
        return _FROM_PROTO[int(v)]
    except KeyError:
        raise InvalidArgument(f"unknown durability {v}") from None


def iter_chunks(
    block_index: int,
    fingerprint: bytes,
    key: bytes,
    payload: memoryview,
    checksum: int | None = None,
) -> Iterator[pb.BlockChunk]:
    """One block as chunks of at most ``CHUNK_BYTES`` (header in the first).

    A server sends ``checksum`` = the one stored with the block (DESIGN §4), never one
    computed from its memory now: bytes damaged in that memory must fail at the receiver.
    ``None`` (a client sending what it computes at commit) computes it here."""
    header = make_header(fingerprint, key, payload, checksum=checksum).pack()
    return _chunked(block_index, header, payload)


def encoded_chunks(block_index: int, block: bytes) -> Iterator[pb.BlockChunk]:
    """An already encoded block (header + payload, ``kvstore.block.encode_block``) as
    chunks of at most ``CHUNK_BYTES``."""
    if len(block) <= CHUNK_BYTES:  # one chunk: sent as it is, no copy
        return iter([pb.BlockChunk(block_index=block_index, offset=0, data=block, last=True)])
    mv = memoryview(block)
    return _chunked(block_index, mv[:HEADER_BYTES], mv[HEADER_BYTES:])


def _chunked(
    block_index: int, header: bytes | memoryview, payload: memoryview
) -> Iterator[pb.BlockChunk]:
    """The one chunker: the header and the start of the payload in the first chunk, then the
    payload in order; ``last`` marks the block's final chunk."""
    first = min(HEADER_BYTES + len(payload), CHUNK_BYTES) - HEADER_BYTES
    yield pb.BlockChunk(
        block_index=block_index,
        offset=0,
        data=bytes(header) + bytes(payload[:first]),
        last=first == len(payload),
    )
    pos = first
    while pos < len(payload):
        end = min(len(payload), pos + CHUNK_BYTES)
        yield pb.BlockChunk(
            block_index=block_index,
            offset=HEADER_BYTES + pos,
            data=bytes(payload[pos:end]),
            last=end == len(payload),
        )
        pos = end


@dataclass(slots=True)
class _Partial:
    header: bytearray
    received: int


class BlockAssembler:
    """Reassembles chunked encoded blocks into payload rows of ``rows``.

    ``slot_of(block_index)`` says which row a block's payload goes to. Chunk order and
    bounds are enforced (``InvalidArgument``: a malformed stream); a block whose header
    or checksum fails verification raises ``BlockError`` from ``add`` on its last chunk.
    """

    def __init__(self, ns: Namespace, keys: Sequence[Key], rows: memoryview, slots: dict[int, int]):
        self._fp = ns.fingerprint
        self._bb = ns.block_bytes
        self._keys = keys
        self._rows = rows
        self._slots = slots
        self._partial: dict[int, _Partial] = {}
        self.complete: list[int] = []  # block indices, in completion order
        self.checksums: dict[int, int] = {}  # block index -> verified header checksum
        self._done: set[int] = set()

    @property
    def encoded_bytes(self) -> int:
        return HEADER_BYTES + self._bb

    @property
    def prefix_blocks(self) -> int:
        """How many blocks from index 0 on arrived and verified without a gap: the one
        prefix counter of every reader (a block after a missing or failed one is no hit,
        whatever arrived)."""
        n = 0
        while n in self.checksums:
            n += 1
        return n

    def prefix_checksums(self, limit: int | None = None) -> list[int]:
        """The verified checksums of the prefix's blocks, in order (at most ``limit``)."""
        n = self.prefix_blocks if limit is None else min(limit, self.prefix_blocks)
        return [self.checksums[i] for i in range(n)]

    def add(self, chunk: pb.BlockChunk) -> bool:
        """Take one chunk; return True when it completed (and verified) a block."""
        idx = chunk.block_index
        slot = self._slots.get(idx)
        if slot is None:
            raise InvalidArgument(f"chunk for block {idx}, which was not announced")
        if idx in self._done:
            raise InvalidArgument(f"chunk for block {idx}, which is already complete")
        data = chunk.data
        if len(data) > CHUNK_BYTES:
            raise InvalidArgument(f"chunk of {len(data)} bytes exceeds {CHUNK_BYTES}")
        part = self._partial.get(idx)
        if part is None:
            part = self._partial[idx] = _Partial(bytearray(HEADER_BYTES), 0)
        if chunk.offset != part.received:
            raise InvalidArgument(
                f"block {idx}: chunk at offset {chunk.offset}, expected {part.received}"
            )
        end = part.received + len(data)
        if end > self.encoded_bytes:
            raise InvalidArgument(
                f"block {idx}: {end} bytes exceed the encoded size {self.encoded_bytes}"
            )
        mv = memoryview(data)
        pos = part.received
        if pos < HEADER_BYTES:
            n = min(HEADER_BYTES - pos, len(mv))
            part.header[pos : pos + n] = mv[:n]
            mv = mv[n:]
            pos += n
        if len(mv):
            base = slot * self._bb + pos - HEADER_BYTES
            self._rows[base : base + len(mv)] = mv
        part.received = end
        if not chunk.last:
            return False
        if end != self.encoded_bytes:
            raise InvalidArgument(
                f"block {idx}: last chunk at {end} bytes, expected {self.encoded_bytes}"
            )
        del self._partial[idx]
        self._done.add(idx)
        self._verify(idx, slot, part.header)
        self.complete.append(idx)
        return True

    def _verify(self, idx: int, slot: int, header: bytearray) -> None:
        hdr = decode_header(header)
        if hdr.fingerprint != self._fp:
            raise BlockError(f"block {idx} belongs to another namespace")
        if hdr.key != self._keys[idx]:
            raise BlockError(
                f"block {idx} carries key {hdr.key.hex()}, expected {self._keys[idx].hex()}"
            )
        if hdr.payload_len != self._bb:
            raise BlockError(f"block {idx}: payload length {hdr.payload_len}, expected {self._bb}")
        row = self._rows[slot * self._bb : (slot + 1) * self._bb]
        if payload_checksum(row) != hdr.checksum:
            raise BlockError(f"block {idx}: payload checksum mismatch")
        self.checksums[idx] = hdr.checksum


def verify_staged_header(header: bytes, ns: Namespace, key: Key, row: memoryview) -> None:
    """Check a same-host staged row against the header the client sent with it."""
    if len(header) != HEADER_BYTES:
        raise InvalidArgument(f"staged header of {len(header)} bytes, expected {HEADER_BYTES}")
    hdr = decode_header(header)
    if hdr.fingerprint != ns.fingerprint or hdr.key != key or hdr.payload_len != ns.block_bytes:
        raise InvalidArgument("staged header does not match its namespace, key or block size")
    if payload_checksum(row) != hdr.checksum:
        raise BlockError("staged payload checksum mismatch")
