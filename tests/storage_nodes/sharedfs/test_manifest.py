"""The manifest record format: round trips, framing, torn and garbled tails."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage_nodes.sharedfs import manifest as mf

keys = st.binary(min_size=16, max_size=16)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
put_entries = st.lists(st.builds(mf.PutEntry, keys, u64, u32, u32, u32), max_size=20)
drop_entries = st.lists(st.builds(mf.DropEntry, keys, u64, u32), max_size=20)
HEADER = mf.Header("d1", 3, {"model_id": "m", "cached_layers": [0, 1]}, b"f" * 16, 2048,
                   4096, 1 << 20, 123)

records = st.one_of(
    put_entries.map(lambda e: (mf.puts(e), [mf.Record(mf.PUT, e)] if e else [])),
    drop_entries.map(lambda e: (mf.drops(e), [mf.Record(mf.DROP, e)] if e else [])),
    st.tuples(u32, st.lists(keys, max_size=20)).map(
        lambda t: (mf.touches(*t), [mf.Record(mf.TOUCH, t)] if t[1] else [])),
    u64.map(lambda s: (mf.segment_add(s), [mf.Record(mf.SEGMENT_ADD, s)])),
    u64.map(lambda s: (mf.segment_free(s), [mf.Record(mf.SEGMENT_FREE, s)])),
    u32.map(lambda t: (mf.delete_ns(t), [mf.Record(mf.DELETE_NS, t)])),
    u32.map(lambda g: (mf.sealed(g), [mf.Record(mf.SEALED, g)])),
    st.just((mf.snapshot_end(), [mf.Record(mf.SNAPSHOT_END, None)])),
)


def _norm(recs: list[mf.Record]) -> list[tuple[int, object]]:
    out = []
    for r in recs:
        v = r.value
        if r.kind == mf.TOUCH:
            v = (v[0], list(v[1]))
        elif r.kind in (mf.PUT, mf.DROP):
            v = [tuple(e) for e in v]
        out.append((r.kind, v))
    return out


def _expected(items: list[tuple[bytes, list[mf.Record]]]) -> list[mf.Record]:
    # An empty PUT/DROP/TOUCH still makes one (empty) frame.
    out = []
    for data, recs in items:
        out += recs if recs else mf.parse(data).records
    return out


@given(st.lists(records, max_size=12))
def test_frames_round_trip(items) -> None:
    data = mf.header(HEADER) + b"".join(d for d, _ in items)
    parsed = mf.parse(data)
    assert parsed.end == len(data) and not parsed.stuck
    assert parsed.records[0] == mf.Record(mf.HEADER, HEADER)
    assert _norm(parsed.records[1:]) == _norm(_expected(items))


@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_a_truncated_file_yields_only_whole_frames(items, data) -> None:
    blob = b"".join(d for d, _ in items)
    cut = data.draw(st.integers(0, len(blob)))
    parsed = mf.parse(blob[:cut])
    assert not parsed.stuck
    assert parsed.end <= cut
    whole = mf.parse(blob)
    # what was read is a prefix of what the whole file says, ending on a frame boundary
    assert _norm(parsed.records) == _norm(whole.records[: len(parsed.records)])
    assert mf.parse(blob[: parsed.end]).end == parsed.end


@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_a_flipped_byte_stops_the_reader_at_that_frame(items, data) -> None:
    blob = bytearray(mf.segment_add(1) + b"".join(d for d, _ in items))
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] ^= 1 << data.draw(st.integers(0, 7))
    parsed = mf.parse(bytes(blob))
    assert parsed.end <= pos  # nothing at or after the damaged frame is applied
    clean = mf.parse(mf.segment_add(1) + b"".join(d for d, _ in items))
    assert _norm(parsed.records) == _norm(clean.records[: len(parsed.records)])


def test_an_incomplete_frame_waits_and_a_bad_one_is_stuck() -> None:
    good = mf.segment_add(7)
    assert mf.parse(good + good[:5]) == mf.Parsed([mf.Record(mf.SEGMENT_ADD, 7)], len(good))
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    p = mf.parse(good + bytes(bad))
    assert p.stuck and p.end == len(good)
    zeros = mf.parse(good + bytes(64))  # size visible before the bytes: length 0
    assert zeros.stuck and zeros.end == len(good)


def test_big_groups_split_into_frames_under_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(mf, "MAX_ENTRIES_PER_FRAME", 3)
    entries = [mf.PutEntry(bytes([i]) * 16, i, i, i, i) for i in range(8)]
    parsed = mf.parse(mf.puts(entries))
    assert [len(r.value) for r in parsed.records] == [3, 3, 2]
    assert [e for r in parsed.records for e in r.value] == entries


def test_unknown_header_format_is_not_applied() -> None:
    body = struct.pack("<B", mf.HEADER) + __import__("msgpack").packb({"format": "other"})
    p = mf.parse(mf.frame(body))
    assert p.stuck and p.records == []


def test_oversized_frame_is_refused() -> None:
    with pytest.raises(ValueError):
        mf.frame(bytes(mf.MAX_FRAME_BYTES + 1))
