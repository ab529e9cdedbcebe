"""``SharedFSTier``: the ``Tier`` (DESIGN §5) of one daemon on a shared file system.

Writes go to this daemon's own segments (a put is: reserve slots, write and sync the
blocks, then publish them in one manifest frame), so no two daemons ever write one file
and no cross-host lock sits on the write path. Reads look the key up in the catalog
(memory: every peer's manifest, tailed) and read the slot from whichever daemon's
segment holds it; every block is header- and checksum-verified, so a slot its owner has
since reused is a counted miss (``stale_slots_total``), never wrong bytes. I/O errors
never raise into callers: reads miss, puts drop, both counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from kvstore.buffers import rows_view
from kvstore.call_gate import CallGate
from kvstore.errors import IntegrityError, InvalidArgument, UnknownNamespace
from kvstore.keys import Key, Namespace, check_keys
from kvstore.tier import PutResult, Tier, TierStats
from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs import ops
from storage_nodes.sharedfs.backends import make_backend
from storage_nodes.sharedfs.collector import Collected, collect, dead_daemons
from storage_nodes.sharedfs.config import SharedFSConfig, slot_bytes_for
from storage_nodes.sharedfs.errors import SharedFSConfigError
from storage_nodes.sharedfs.layout import Layout
from storage_nodes.sharedfs.lease import claim_owner
from storage_nodes.sharedfs.maintenance import COMPACT_CHECK_S, Maintenance
from storage_nodes.sharedfs.presence import Presence
from storage_nodes.sharedfs.publish import flush_deferred, flush_touches, roll
from storage_nodes.sharedfs.recovery import Recovered, read_own, reconcile_files
from storage_nodes.sharedfs.segments import DATA_OFFSET, SegmentFiles
from storage_nodes.sharedfs.spaces import adopt, new_state, start_log
from storage_nodes.sharedfs.state import Context, NsState
from storage_nodes.sharedfs.stats import build_stats

log = logging.getLogger("storage_nodes.sharedfs")


class SharedFSTier(Tier):
    name = "ssd"

    def __init__(self, config: SharedFSConfig) -> None:
        layout = Layout(config.root)
        layout.ensure()
        now = config.clock()
        self._presence = Presence(layout, config.daemon_id, config.heartbeat_s,
                                  config.clock_skew_s, now)
        self._gate = CallGate(f"shared-fs tier {config.root} is closed")
        self._poll_lock = threading.Lock()
        self._maint: Maintenance | None = None
        try:
            found = [(t, fp, d, read_own(d, fp, config.daemon_id))
                     for t, fp, d in layout.owner_dirs_of(config.daemon_id)]
            config = _adopt_segment_size(config, [r for *_, r in found if r is not None])
            self.config = config
            epoch = claim_owner(layout, config.daemon_id)
            self._presence.epoch = epoch
            self._presence.beat(now)
            io = make_backend(config.io_backend, self._presence.dir, config.queue_depth,
                              config.direct_io)
            self._ctx = Context(config, layout, io, SegmentFiles(io, config.max_open_segments),
                                epoch)
            for tenant, fp, d, rec in found:
                self._recover(tenant, fp, d, rec)
        except BaseException:
            ctx = getattr(self, "_ctx", None)
            if ctx is not None:
                ctx.files.close()
                ctx.syncs.shutdown()
                ctx.io.close()
            self._presence.release()
            raise
        if config.maintenance:
            self._maint = Maintenance(self._jobs(), lambda: self._ctx.add(
                {"maintenance_errors": 1}))

    def _recover(self, tenant: str, fp: bytes, d: Any, rec: Recovered | None) -> None:
        ctx = self._ctx
        if rec is None:  # no usable manifest: nothing in d was ever published
            reconcile_files(d, Recovered(mf.Header(ctx.me, 0, {}, fp, 0, 0, 0, 0)))
            return
        orphans, lost = reconcile_files(d, rec)
        h = rec.header
        st = new_state(ctx, tenant, fp, h.namespace, h.block_bytes)
        with ctx.lock:
            adopt(ctx, st, rec)
            ctx.spaces[fp] = st
        start_log(ctx, st)
        log.info("shared-fs %s: adopted %d blocks in %d segments of %s (%d orphan files "
                 "removed, %d segments lost%s)", ctx.me, len(rec.blocks), len(rec.segments),
                 fp.hex(), orphans, lost, ", torn tail dropped" if rec.torn else "")

    def _jobs(self) -> list[tuple[str, float, Any]]:
        c = self.config
        jobs: list[tuple[str, float, Any]] = [
            ("poll", c.poll_interval_s, lambda: self.poll(rescan=False)),
            ("rescan", c.rescan_interval_s, lambda: self.poll(rescan=True)),
            ("touches", c.touch_flush_s, self.flush_touches),
            ("heartbeat", c.heartbeat_s, self._beat),
            ("compact", COMPACT_CHECK_S, self.compact),
        ]
        if c.sweep_interval_s is not None:
            jobs.append(("sweep", c.sweep_interval_s, self.sweep))
        if c.collect_interval_s is not None:
            jobs.append(("collect", c.collect_interval_s, self.collect))
        return jobs

    # -- plumbing ---------------------------------------------------------------------
    def _state(self, ns: Namespace) -> NsState:
        st = self._ctx.spaces.get(ns.fingerprint)
        if st is None or st.ns != ns:
            raise UnknownNamespace(
                f"namespace {ns.model_id!r} is not registered with the shared-fs tier")
        return st

    @staticmethod
    def _keys(keys: Sequence[Key]) -> list[bytes]:
        return check_keys(keys)

    # -- Tier API ---------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._gate.call():
            ctx = self._ctx
            if slot_bytes_for(ns.block_bytes) > self.config.segment_bytes - DATA_OFFSET:
                raise SharedFSConfigError(
                    f"blocks of {ns.block_bytes} bytes do not fit a "
                    f"{self.config.segment_bytes}-byte segment")
            st = ctx.spaces.get(ns.fingerprint)
            if st is None:
                st = new_state(ctx, ns.tenant, ns.fingerprint, ns.to_dict(), ns.block_bytes)
                start_log(ctx, st)
                with ctx.lock:
                    st = ctx.spaces.setdefault(ns.fingerprint, st)
            st.ns = ns
            self._poll_one(st, rescan=True)  # what peers already hold is a hit at once

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        with self._gate.call():
            st = self._state(ns)
            ks = self._keys(keys)
            with self._ctx.lock:
                return len(st.catalog.prefix(ks, self._ctx.floor()))

    def get_into(self, ns: Namespace, keys: Sequence[Key], dst: Any, *,
                 checksums: list[int] | None = None) -> int:
        with self._gate.call():
            st = self._state(ns)
            out = rows_view(dst, len(keys), ns.block_bytes, writable=True)
            return ops.get(self._ctx, st, self._keys(keys), out, checksums)

    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        with self._gate.call():
            st = self._state(ns)
            data = rows_view(src, len(keys), ns.block_bytes)
            ks = self._keys(keys)
            if len(set(ks)) != len(ks):
                raise InvalidArgument("put: duplicate keys in one call")
            if checksums is not None and len(checksums) != len(ks):
                raise InvalidArgument(f"put: {len(checksums)} checksums for {len(ks)} keys")
            return ops.put(self._ctx, st, ks, data, present_ok, checksums)

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._gate.call():
            ops.note_touch(self._ctx, self._state(ns), self._keys(keys))

    def delete_namespace(self, ns: Namespace) -> int:
        with self._gate.call():
            return ops.delete_namespace(self._ctx, self._state(ns))

    # -- maintenance (the background thread calls these; tests call them directly) ----
    def poll(self, *, rescan: bool = True) -> None:
        """Read what peers appended (and, with ``rescan``, find new peers/generations)."""
        with self._gate.call():
            for st in list(self._ctx.spaces.values()):
                self._poll_one(st, rescan=rescan)

    def _poll_one(self, st: NsState, *, rescan: bool) -> None:
        assert st.tailer is not None
        with self._poll_lock:
            if rescan:
                st.tailer.rescan()
            st.tailer.poll()
            self._ctx.counts["manifest_stuck_reads"] = sum(
                s.tailer.stuck_reads for s in self._ctx.spaces.values() if s.tailer)
        if st.deferred:
            flush_deferred(self._ctx, st)

    def flush_touches(self) -> None:
        """Publish pending access times now (normally every ``touch_flush_s``)."""
        with self._gate.call():
            for st in list(self._ctx.spaces.values()):
                flush_touches(self._ctx, st)

    def sweep(self) -> int:
        """Drop own blocks idle longer than the retention; returns how many went."""
        with self._gate.call():
            return sum(ops.sweep(self._ctx, st) for st in list(self._ctx.spaces.values()))

    def compact(self) -> None:
        """Roll manifests grown past 4 × their snapshot; delete retired generations."""
        with self._gate.call():
            for st in list(self._ctx.spaces.values()):
                if st.log.needs_compaction(self.config.compact_min_bytes):
                    with st.publish:
                        roll(self._ctx, st)
                st.log.reap()

    def collect(self) -> list[Collected]:
        """Collect daemons gone longer than ``dead_after_s`` (under a fencing lease)."""
        with self._gate.call():
            c = self.config
            out = []
            for d in dead_daemons(self._ctx.layout, c.daemon_id, c.clock(), c.dead_after_s):
                got = collect(self._ctx.layout, d, c, c.clock)
                if got is not None:
                    out.append(got)
                    self._ctx.add({"collected_daemons": int(got.complete),
                                   "collected_files": len(got.removed)})
            return out

    def _beat(self) -> None:
        self._presence.beat(self.config.clock())

    def iter_keys(self, ns: Namespace) -> list[Key]:
        """This daemon's own keys of ``ns`` (for checks and tooling)."""
        with self._gate.call(), self._ctx.lock:
            return list(self._state(ns).own.lru)

    def namespace_blocks(self, fingerprints: Collection[bytes]) -> dict[bytes, int]:
        """This daemon's own blocks of each namespace, as its stats count them."""
        with self._gate.call(), self._ctx.lock:
            spaces = self._ctx.spaces
            return {
                fp: spaces[fp].own.used_blocks() if fp in spaces else 0
                for fp in set(fingerprints)
            }

    def block_footprint(self, block_bytes: int) -> int:
        return slot_bytes_for(block_bytes)  # header and alignment, as stats() counts

    # -- stats, checks, lifecycle -----------------------------------------------------
    def stats(self) -> TierStats:
        with self._gate.call():
            registered = {st.block_bytes for st in self._ctx.spaces.values() if st.ns}
            return build_stats(self._ctx, registered, "ok")

    def check_integrity(self) -> None:
        with self._gate.call(), self._ctx.lock:
            ctx = self._ctx
            for st in ctx.spaces.values():
                st.catalog.check()
                st.own.check()
                for key, b in st.own.lru.items():
                    if ctx.me not in {loc.owner for loc in st.catalog.locations(key)
                                      if (loc.seg, loc.slot) == (b.seg, b.slot)}:
                        raise IntegrityError(f"own block {key.hex()} missing from the catalog")
                mine = sum(1 for _ in st.catalog.keys_of(ctx.me))
                if mine != len(st.own.lru):
                    raise IntegrityError(
                        f"catalog names {mine} own blocks, own space holds {len(st.own.lru)}")
            if ctx.segments_in_use() > self.config.chunks:
                raise IntegrityError(
                    f"{ctx.segments_in_use()} segments exceed {self.config.chunks} chunks")

    def close(self) -> None:
        self._gate.close_sequence(stop=self._stop_maintenance, flush=self._flush_at_close,
                                  release=self._release)

    def _stop_as_crashed(self) -> None:
        """Protected test seam, not API (``storage_nodes.testing.crash.abandon``): stop as
        a crash would (no flush) and release the daemon id."""
        self._gate.close_sequence(stop=self._stop_maintenance, release=self._release)

    def _stop_maintenance(self) -> None:
        if self._maint is not None:
            self._maint.stop()

    def _flush_at_close(self) -> None:
        for st in list(self._ctx.spaces.values()):
            try:
                flush_touches(self._ctx, st)
                flush_deferred(self._ctx, st)
            except Exception as e:
                log.error("shared-fs %s: touches lost at close: %s", self.config.root, e)

    def _release(self) -> None:
        ctx = self._ctx
        for st in ctx.spaces.values():
            if st.tailer is not None:
                st.tailer.close()
            st.log.close()
        ctx.syncs.shutdown()
        ctx.files.close()
        ctx.io.close()
        self._presence.release()


def _adopt_segment_size(config: SharedFSConfig, found: list[Recovered]) -> SharedFSConfig:
    """A daemon's files keep the segment size they were written with."""
    sizes = {r.header.segment_bytes for r in found}
    if not sizes or sizes == {config.segment_bytes}:
        return config
    if len(sizes) > 1:
        raise SharedFSConfigError(f"daemon {config.daemon_id}'s files mix segment sizes {sizes}")
    stored = sizes.pop()
    if config.segment_auto:
        return replace(config, segment_bytes=stored)
    raise SharedFSConfigError(
        f"daemon {config.daemon_id}'s files were written with segment_bytes={stored}, "
        f"not {config.segment_bytes}: keep the size or use a new daemon id")
