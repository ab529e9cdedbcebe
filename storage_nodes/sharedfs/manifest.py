"""The manifest record format (normative for every daemon on a mount).

A manifest is an append-only file written by exactly one daemon for one namespace:
``manifest-<G>.log`` in ``tenants/<tenant>/<fingerprint>/<daemon>/``. It is a sequence
of frames, all integers little-endian::

    u32 body length | u64 xxh3-64 of the body | body = u8 record type + fields

A frame is one atomic group: readers apply a frame whole or not at all. A frame whose
bytes are not all there yet, or whose checksum does not match, ends what a reader
applies for now: it is re-read at the next poll (on a distributed file system the size
of a file can run ahead of its bytes). A writer never appends after a frame it did not
finish: after a failed append or a crash it starts a new generation.

Records (``access_s`` and ``born_s`` are whole seconds since the epoch, rounded down to
the writer's access bucket):

======  ==============  ===========================================================
type    name            fields
======  ==============  ===========================================================
1       HEADER          msgpack map: format, daemon, generation, namespace (the
                        Namespace fields), fingerprint, block_bytes, slot_bytes,
                        segment_bytes, created_us. Always the first frame.
2       SEGMENT_ADD     u64 segment id: the file ``seg-<id as 16 hex>`` exists
3       SEGMENT_FREE    u64 segment id: forget every block in it; the file goes
4       PUT             u32 n, n × (key 16, u64 segment, u32 slot, u32 access_s,
                        u32 born_s): the block is durable in that slot
5       DROP            u32 n, n × (key 16, u64 segment, u32 slot): no longer there
6       TOUCH           u32 access_s, u32 n, n × key 16: read or re-put at access_s
                        (any daemon's blocks: keys are global)
7       DELETE_NS       u32 t_s: every block of the namespace born at or before t_s
                        is gone, whoever wrote it (its owner drops it on reading this)
8       SNAPSHOT_END    (none): the state a new generation starts from is complete
9       SEALED          u32 next generation: nothing follows; read that file next
======  ==============  ===========================================================

A new generation starts with HEADER, the writer's live state (SEGMENT_ADD, PUT) and
SNAPSHOT_END; it is written to a temporary name and renamed into place complete.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import xxhash

from storage_nodes.sharedfs.errors import ManifestError

FORMAT = "kvstore-manifest-1"
FRAME = struct.Struct("<IQ")
MAX_FRAME_BYTES = 64 << 20
PUT_ENTRY = struct.Struct("<16sQIII")
DROP_ENTRY = struct.Struct("<16sQI")
MAX_ENTRIES_PER_FRAME = (MAX_FRAME_BYTES - 16) // PUT_ENTRY.size

HEADER, SEGMENT_ADD, SEGMENT_FREE, PUT, DROP, TOUCH, DELETE_NS, SNAPSHOT_END, SEALED = range(1, 10)

_U8 = struct.Struct("<B")
_U8_U64 = struct.Struct("<BQ")
_U8_U32 = struct.Struct("<BI")
_U8_U32_U32 = struct.Struct("<BII")


class PutEntry(NamedTuple):
    key: bytes
    seg: int
    slot: int
    access_s: int
    born_s: int


class DropEntry(NamedTuple):
    key: bytes
    seg: int
    slot: int


@dataclass(frozen=True, slots=True)
class Header:
    daemon: str
    generation: int
    namespace: dict[str, Any]
    fingerprint: bytes
    block_bytes: int
    slot_bytes: int
    segment_bytes: int
    created_us: int


class Record(NamedTuple):
    """One decoded record: ``kind`` is the type number, ``value`` its fields (a
    ``Header``, an int, a list of entries, or ``(access_s, keys)`` for TOUCH)."""

    kind: int
    value: Any


# -- encoding -----------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"manifest frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return FRAME.pack(len(body), xxhash.xxh3_64_intdigest(body)) + body


def header(h: Header) -> bytes:
    fields = {
        "format": FORMAT,
        "daemon": h.daemon,
        "generation": h.generation,
        "namespace": h.namespace,
        "fingerprint": h.fingerprint,
        "block_bytes": h.block_bytes,
        "slot_bytes": h.slot_bytes,
        "segment_bytes": h.segment_bytes,
        "created_us": h.created_us,
    }
    return frame(_U8.pack(HEADER) + msgpack.packb(fields, use_bin_type=True))


def segment_add(seg: int) -> bytes:
    return frame(_U8_U64.pack(SEGMENT_ADD, seg))


def segment_free(seg: int) -> bytes:
    return frame(_U8_U64.pack(SEGMENT_FREE, seg))


def puts(entries: Sequence[PutEntry]) -> bytes:
    return b"".join(
        frame(_U8_U32.pack(PUT, len(part)) + b"".join(PUT_ENTRY.pack(*e) for e in part))
        for part in _parts(entries)
    )


def drops(entries: Sequence[DropEntry]) -> bytes:
    return b"".join(
        frame(_U8_U32.pack(DROP, len(part)) + b"".join(DROP_ENTRY.pack(*e) for e in part))
        for part in _parts(entries)
    )


def touches(access_s: int, keys: Sequence[bytes]) -> bytes:
    return b"".join(
        frame(_U8_U32_U32.pack(TOUCH, access_s, len(part)) + b"".join(part))
        for part in _parts(keys)
    )


def delete_ns(t_s: int) -> bytes:
    return frame(_U8_U32.pack(DELETE_NS, t_s))


def snapshot_end() -> bytes:
    return frame(_U8.pack(SNAPSHOT_END))


def sealed(next_generation: int) -> bytes:
    return frame(_U8_U32.pack(SEALED, next_generation))


def _parts(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), MAX_ENTRIES_PER_FRAME):
        yield items[start : start + MAX_ENTRIES_PER_FRAME]


# -- decoding -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Parsed:
    """Records decoded from ``buf[start:end]``. ``stuck`` is True when the frame at
    ``end`` is complete by its length but fails its checksum (not visible yet, or torn
    by a crash); otherwise the bytes past ``end`` are an incomplete frame or nothing."""

    records: list[Record]
    end: int
    stuck: bool = False


def parse(buf: bytes | memoryview, start: int = 0) -> Parsed:
    mv = memoryview(buf)
    pos = start
    out: list[Record] = []
    while pos + FRAME.size <= len(mv):
        length, digest = FRAME.unpack_from(mv, pos)
        if length == 0 or length > MAX_FRAME_BYTES:
            return Parsed(out, pos, stuck=True)
        end = pos + FRAME.size + length
        if end > len(mv):
            break
        body = mv[pos + FRAME.size : end]
        if xxhash.xxh3_64_intdigest(body) != digest:
            return Parsed(out, pos, stuck=True)
        try:
            out.append(decode_body(body))
        except Exception:  # checksummed yet undecodable: another format or a bug
            return Parsed(out, pos, stuck=True)
        pos = end
    return Parsed(out, pos)


def decode_body(body: memoryview) -> Record:
    kind = body[0]
    if kind == PUT:
        (n,) = struct.unpack_from("<I", body, 1)
        _expect(len(body), 5 + n * PUT_ENTRY.size)
        return Record(PUT, [PutEntry(*e) for e in PUT_ENTRY.iter_unpack(body[5:])])
    if kind == TOUCH:
        access_s, n = struct.unpack_from("<II", body, 1)
        _expect(len(body), 9 + 16 * n)
        raw = bytes(body[9:])
        return Record(TOUCH, (access_s, [raw[i : i + 16] for i in range(0, 16 * n, 16)]))
    if kind == DROP:
        (n,) = struct.unpack_from("<I", body, 1)
        _expect(len(body), 5 + n * DROP_ENTRY.size)
        return Record(DROP, [DropEntry(*e) for e in DROP_ENTRY.iter_unpack(body[5:])])
    if kind in (SEGMENT_ADD, SEGMENT_FREE):
        _expect(len(body), 9)
        return Record(kind, struct.unpack_from("<Q", body, 1)[0])
    if kind in (DELETE_NS, SEALED):
        _expect(len(body), 5)
        return Record(kind, struct.unpack_from("<I", body, 1)[0])
    if kind == SNAPSHOT_END:
        _expect(len(body), 1)
        return Record(SNAPSHOT_END, None)
    if kind == HEADER:
        return Record(HEADER, _decode_header(bytes(body[1:])))
    raise ValueError(f"unknown manifest record type {kind}")


def _decode_header(raw: bytes) -> Header:
    d = msgpack.unpackb(raw, raw=False)
    if d.get("format") != FORMAT:
        raise ManifestError(f"unknown manifest format {d.get('format')!r}")
    return Header(
        daemon=str(d["daemon"]),
        generation=int(d["generation"]),
        namespace=dict(d["namespace"]),
        fingerprint=bytes(d["fingerprint"]),
        block_bytes=int(d["block_bytes"]),
        slot_bytes=int(d["slot_bytes"]),
        segment_bytes=int(d["segment_bytes"]),
        created_us=int(d["created_us"]),
    )


def _expect(got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"manifest record of {got} bytes, expected {want}")
