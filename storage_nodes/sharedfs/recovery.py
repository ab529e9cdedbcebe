"""Adopting this daemon's own files at start: its manifests are its index.

For each namespace directory under this daemon's id, the newest generation with a
complete snapshot is replayed (a torn last frame, left by a crash, ends the replay:
everything before it was durable, everything in it is unpublished and its slots are
free again). Segment files the manifest does not name (created just before a crash)
are removed; blocks in segments whose file is missing are forgotten. Then the tier
starts a new generation from what it adopted, so it never appends after a torn frame.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.layout import manifest_name, manifests_in, segments_in

log = logging.getLogger("storage_nodes.sharedfs")


@dataclass
class Recovered:
    """One namespace as this daemon's own manifest left it."""

    header: mf.Header
    segments: set[int] = field(default_factory=set)
    # key -> (seg, slot, access_s, born_s), in the order of last access (oldest first)
    blocks: dict[bytes, tuple[int, int, int, int]] = field(default_factory=dict)
    torn: bool = False


def read_own(d: Path, fingerprint: bytes, me: str) -> Recovered | None:
    """The newest usable generation in ``d``, replayed; None if there is none."""
    for gen in reversed(manifests_in(d)):
        try:
            data = (d / manifest_name(gen)).read_bytes()
        except OSError as e:
            log.warning("cannot read own manifest %s: %s", d / manifest_name(gen), e)
            continue
        parsed = mf.parse(data)
        recs = parsed.records
        if not recs or recs[0].kind != mf.HEADER:
            continue
        head = recs[0].value
        if head.fingerprint != fingerprint or head.daemon != me:
            log.warning("manifest %s belongs to another namespace or daemon", d)
            continue
        if not any(r.kind == mf.SNAPSHOT_END for r in recs):
            continue
        rec = Recovered(head, torn=parsed.stuck or parsed.end != len(data))
        _replay(rec, recs[1:])
        return rec
    return None


def _replay(rec: Recovered, records: list[mf.Record]) -> None:
    blocks = rec.blocks
    at: dict[tuple[int, int], bytes] = {}
    for r in records:
        if r.kind == mf.PUT:
            for e in r.value:
                old = at.get((e.seg, e.slot))
                if old is not None and old != e.key:
                    blocks.pop(old, None)
                prev = blocks.pop(e.key, None)
                if prev is not None and (prev[0], prev[1]) != (e.seg, e.slot):
                    at.pop((prev[0], prev[1]), None)
                blocks[e.key] = (e.seg, e.slot, e.access_s, e.born_s)
                at[(e.seg, e.slot)] = e.key
        elif r.kind == mf.DROP:
            for e in r.value:
                b = blocks.get(e.key)
                if b is not None and (b[0], b[1]) == (e.seg, e.slot):
                    del blocks[e.key]
                    at.pop((e.seg, e.slot), None)
        elif r.kind == mf.TOUCH:
            access_s, keys = r.value
            for k in keys:
                b = blocks.get(k)
                if b is not None and access_s >= b[2]:
                    del blocks[k]  # re-inserted last: most recent
                    blocks[k] = (b[0], b[1], access_s, b[3])
        elif r.kind == mf.SEGMENT_ADD:
            rec.segments.add(r.value)
        elif r.kind == mf.SEGMENT_FREE:
            rec.segments.discard(r.value)
            for k in [k for k, b in blocks.items() if b[0] == r.value]:
                del blocks[k]
        elif r.kind == mf.DELETE_NS:
            for k in [k for k, b in blocks.items() if b[3] <= r.value]:
                del blocks[k]
    for k in [k for k, b in blocks.items() if b[0] not in rec.segments]:
        del blocks[k]


def reconcile_files(d: Path, rec: Recovered) -> tuple[int, int]:
    """Remove segment files the manifest does not name; forget named ones that are
    missing. Returns (orphans removed, segments lost)."""
    on_disk = set(segments_in(d))
    orphans = on_disk - rec.segments
    for s in orphans:
        with contextlib.suppress(OSError):
            os.unlink(d / f"seg-{s:016x}")
    lost = rec.segments - on_disk
    if lost:
        log.warning("%s: %d segment files named by the manifest are missing", d, len(lost))
        rec.segments -= lost
        for k in [k for k, b in rec.blocks.items() if b[0] in lost]:
            del rec.blocks[k]
    for name in os.listdir(d):
        if name.startswith(".manifest-") and name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(d / name)
    return len(orphans), len(lost)
