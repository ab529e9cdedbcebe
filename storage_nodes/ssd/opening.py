"""Opening a directory: trust its index or rebuild it from the slot headers, and keep
the shutdown marker honest for the next open (``marker.py`` says when an index can be
trusted). A directory written before the marker existed was written with synced
commits only, so it is trusted as it is. ``IndexLifecycle.assemble`` builds everything
an open tier runs on, in order, and closes what it built if a later step fails.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from storage_nodes.ssd.allocator import SlotAllocator
from storage_nodes.ssd.backends import make_backend
from storage_nodes.ssd.blockio import BlockIO
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.errors import SSDFormatError, SSDIOError
from storage_nodes.ssd.index import CORRUPT, Index
from storage_nodes.ssd.io_backend import IOBackend
from storage_nodes.ssd.lookup import LiveIndex
from storage_nodes.ssd.marker import ShutdownMarker
from storage_nodes.ssd.rebuild import RebuildReport, rebuild_index
from storage_nodes.ssd.recency import Recency
from storage_nodes.ssd.slab_table import SlabTable, Tombstones
from storage_nodes.ssd.slabs import FULL_ERRNOS, SlabFiles
from storage_nodes.ssd.syncer import DataSync, make_data_sync
from storage_nodes.ssd.writer import GroupCommit

log = logging.getLogger("storage_nodes.ssd")
_NEVER_THIS_BOOT = "rebuild"  # a boot id no machine has: the next open rebuilds


@dataclass(frozen=True)
class Opened:
    config: SSDConfig  # with the directory's own slab size
    index: Index
    files: SlabFiles
    blocks: BlockIO
    rebuilt: RebuildReport | None


@dataclass(frozen=True)
class Parts:
    """Everything an open tier runs on (``IndexLifecycle.assemble``)."""

    config: SSDConfig  # with the directory's own slab size
    io: IOBackend
    index: Index
    files: SlabFiles
    blocks: BlockIO
    rebuilt: RebuildReport | None
    recency: Recency
    view: LiveIndex
    alloc: SlotAllocator
    sync: DataSync
    writer: GroupCommit
    room: bool  # the file system took this open's first write (else: read-only)

    def release(self) -> None:
        self.sync.abandon()  # joined before the files it syncs are closed
        self.blocks.close()
        self.io.close()
        self.files.close()
        self.index.close()


class IndexLifecycle:
    def __init__(self, config: SSDConfig) -> None:
        self._config = config
        self.marker = ShutdownMarker(config.dir)
        self.table = SlabTable(config.dir)
        self.tombstones = Tombstones(config.dir)
        self.boot_id = config.boot_id()
        self.strict = config.index_durability == "strict"
        self.dirty = False  # this open marked the directory dirty (its index is written)

    def assemble(
        self,
        count: Callable[[Mapping[str, int]], None],
        write_failed: Callable[[SSDIOError], None],
    ) -> Parts:
        """Open the directory and build the tier's parts on it; ``count`` adds to the
        tier's counters, ``write_failed`` is told of a failed data sync round."""
        opened: list[Any] = []
        try:
            io = make_backend(self._config.io_backend, self._config.queue_depth)
            opened.append(io)
            o = self.open(io)
            config = o.config
            opened += [o.index, o.files]
            with o.index.begin() as txn:
                first_seq = o.index.seq_high_water(txn) + 1
            recency = Recency(config, first_seq)
            view = LiveIndex(config, o.index, recency)
            alloc = SlotAllocator(config, o.index, o.files, recency, count, self.table)
            room = o.files.room_at_open and self.begin_writes()
            if room:
                alloc.shrink_to_capacity()  # an index write: only once marked dirty
            sync = make_data_sync(config, io, o.files.fd, write_failed)
            opened.append(sync)  # nothing written yet: its final sync is a no-op
            writer = GroupCommit(config, o.index, view, recency, alloc, o.blocks, sync)
        except BaseException:
            for res in reversed(opened):
                res.close()
            raise
        return Parts(
            config, io, o.index, o.files, o.blocks, o.rebuilt, recency, view, alloc, sync,
            writer, room,
        )

    def open(self, io: IOBackend) -> Opened:
        config = self._config
        path = config.dir / "index"
        state = self.marker.read()
        why = ""
        if self.marker.needs_rebuild(state, self.boot_id, (path / "data.mdb").exists()):
            why = f"unclean shutdown in an earlier boot ({state.boot_id})"
        index = None
        table: dict[int, int] = {}
        if not why:
            try:
                index = self._index(path, config.slab_bytes, config.slab_auto)
                with index.begin() as txn:  # touch the trees: LMDB may find them corrupt
                    index.slab_table(txn)
                    index.seq_high_water(txn)
            except CORRUPT as e:
                if index is not None:
                    index.close()
                index, why = None, f"index corrupt: {e}"
        if index is None:
            slab_bytes, table = self._table_for_rebuild(why)
            log.warning("SSD %s: rebuilding the index: %s", config.dir, why)
            shutil.rmtree(path, ignore_errors=True)
            index = self._index(path, slab_bytes, True)
        if index.slab_bytes != config.slab_bytes:
            config = config.with_slab_bytes(index.slab_bytes)
        try:
            files = SlabFiles(config.dir, config.slab_bytes, config.direct_io, config.chunks)
        except BaseException:
            index.close()
            raise
        blocks = BlockIO(config, files, io)
        report = None
        try:
            if why:
                report = rebuild_index(
                    config, index, table, self.tombstones.read(), files, io, blocks.staging
                )
            else:
                self._sync_table(index, config.slab_bytes)
            index.sync()  # whatever an earlier open left in the page cache, durable now
        except BaseException:
            files.close()
            index.close()
            raise
        return Opened(config, index, files, blocks, report)

    def _index(self, path, slab_bytes: int, adopt: bool) -> Index:  # type: ignore[no-untyped-def]
        c = self._config
        return Index(
            path,
            map_bytes=c.index_map_bytes,
            slab_bytes=slab_bytes,
            adopt_stored=adopt,
            strict=self.strict,
            on_sync=lambda: c.crash_point("index_synced"),
        )

    def _table_for_rebuild(self, why: str) -> tuple[int, dict[int, int]]:
        try:
            slab_bytes, table = self.table.read()
        except ValueError as e:
            raise SSDFormatError(f"cannot rebuild the index ({why}): {e}") from e
        if not slab_bytes:
            raise SSDFormatError(f"cannot rebuild the index ({why}): no slab table")
        c = self._config
        if not c.slab_auto and slab_bytes != c.slab_bytes:
            raise SSDFormatError(
                f"SSD directory was created with slab_bytes={slab_bytes}, not {c.slab_bytes}"
            )
        return slab_bytes, table

    def _sync_table(self, index: Index, slab_bytes: int) -> None:
        """A trusted index is the truth about slabs: the durable table follows it (it
        lags after a crash between the two, or is missing in an older directory)."""
        with index.begin() as txn:
            want = {s: i.block_bytes for s, i in index.slab_table(txn).items()}
        have_bytes, have = self.table.read() if self.table.exists() else (0, {})
        if (have_bytes, have) != (slab_bytes, want):
            self.table.write(slab_bytes, want)

    def begin_writes(self) -> bool:
        """Mark the directory dirty before this open's first index write; False when
        the disk is too full to (the tier then stays read-only)."""
        if self.dirty:
            return True
        try:
            self.marker.mark_dirty(self.boot_id, "strict" if self.strict else "fast")
        except OSError as e:
            if e.errno in FULL_ERRNOS or e.errno == errno.EROFS:
                return False
            raise
        self.dirty = True
        return True

    def close_clean(self, index: Index) -> None:
        """Sync the index, then say so: the next open trusts it without a rebuild."""
        if self.dirty:
            index.sync()
            self.marker.mark_clean()

    def corrupt(self) -> None:
        """LMDB found the index corrupt while running: the next open rebuilds it."""
        try:
            self.marker.mark_dirty(_NEVER_THIS_BOOT, "fast")
        except OSError:
            log.error("SSD %s: cannot mark the corrupt index for a rebuild", self._config.dir)
        self.dirty = False  # never mark it clean again in this open
