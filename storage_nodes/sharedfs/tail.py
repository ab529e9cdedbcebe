"""Following every peer's manifest of one namespace.

Each poll reads what each peer appended since the last one (one ``pread`` per peer
whose file grew: the kernel answers from the FUSE attribute cache when it did not) and
hands the complete frames to ``apply``. Peers and new generations are found by listing
the namespace directory every ``rescan_interval_s``; a SEALED record names the next
generation, which is followed at once. A generation is applied only once its snapshot
is complete, and then replaces everything known about that peer.

Pages are dropped from the cache before each read (``fresh``): a FUSE page cache may
keep serving the old end of a file that another host has since appended to.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.layout import Layout, manifest_name, manifests_in

log = logging.getLogger("storage_nodes.sharedfs")
_READ_BYTES = 4 << 20

#: apply(owner, records, replace): replace=True first forgets everything about owner.
Apply = Callable[[str, list[mf.Record], bool], None]


@dataclass
class PeerLog:
    owner: str
    generation: int
    path: Path
    fd: int | None = None
    offset: int = 0
    snapshot: list[mf.Record] | None = field(default_factory=list)  # None once applied
    sealed_next: int | None = None
    stuck: bool = False
    bad: bool = False


class Tailer:
    def __init__(
        self,
        layout: Layout,
        tenant: str,
        fingerprint: bytes,
        me: str,
        apply: Apply,
        forget: Callable[[str], None],
    ) -> None:
        self.layout = layout
        self.tenant = tenant
        self.fingerprint = fingerprint
        self.me = me
        self._apply = apply
        self._forget = forget
        self.peers: dict[str, PeerLog] = {}
        self.stuck_reads = 0

    def _dir(self, owner: str) -> Path:
        return self.layout.owner_dir(self.tenant, self.fingerprint, owner)

    def rescan(self) -> None:
        """Find new peers and generations; forget peers whose files are gone."""
        owners = set(self.layout.owners_of(self.tenant, self.fingerprint)) - {self.me}
        for gone in set(self.peers) - owners:
            self._drop(gone)
        for owner in owners:
            gens = manifests_in(self._dir(owner))
            peer = self.peers.get(owner)
            if not gens:
                if peer is not None:
                    self._drop(owner)
                continue
            if peer is None:
                self.peers[owner] = self._open(owner, gens[-1])
            elif gens[-1] > peer.generation:
                self._read(peer)  # take what the old generation still says, then move on
                if self.peers.get(owner) is peer:
                    self._switch(peer, gens[-1])

    def poll(self) -> int:
        """Read and apply what every known peer appended; returns records applied."""
        return sum(self._read(p) for p in list(self.peers.values()))

    def close(self) -> None:
        for p in self.peers.values():
            _close(p)
        self.peers.clear()

    # -- one peer ---------------------------------------------------------------------
    def _open(self, owner: str, generation: int) -> PeerLog:
        return PeerLog(owner, generation, self._dir(owner) / manifest_name(generation))

    def _drop(self, owner: str) -> None:
        peer = self.peers.pop(owner, None)
        if peer is not None:
            _close(peer)
        self._forget(owner)

    def _switch(self, peer: PeerLog, generation: int) -> None:
        _close(peer)
        self.peers[peer.owner] = self._open(peer.owner, generation)

    def _read(self, peer: PeerLog) -> int:
        if peer.bad:
            return 0
        if peer.fd is None:
            try:
                peer.fd = os.open(peer.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ESTALE):
                    log.warning("cannot open manifest %s: %s", peer.path, e)
                return 0  # retired meanwhile: the next rescan finds its successor
        data = _read_from(peer.fd, peer.offset)
        if not data:
            return 0
        parsed = mf.parse(data)
        if parsed.stuck:
            self.stuck_reads += 1
        peer.stuck = parsed.stuck
        at_start = peer.offset == 0
        peer.offset += parsed.end
        records = parsed.records
        if at_start and records:
            first = records[0]
            if first.kind != mf.HEADER or not self._ours(first.value, peer):
                log.warning("ignoring manifest %s: its header does not match", peer.path)
                peer.bad = True
                return 0
        applied = 0
        for i, rec in enumerate(records):
            if rec.kind == mf.SEALED:
                peer.sealed_next = int(rec.value)
                records = records[:i]
                break
        if peer.snapshot is not None:
            for i, rec in enumerate(records):
                if rec.kind == mf.SNAPSHOT_END:
                    self._apply(peer.owner, peer.snapshot + records[:i], True)
                    applied += len(peer.snapshot) + i
                    peer.snapshot = None
                    records = records[i + 1 :]
                    break
            else:
                peer.snapshot.extend(records)
                records = []
        if records:
            self._apply(peer.owner, records, False)
            applied += len(records)
        if peer.sealed_next is not None and peer.snapshot is None:
            self._switch(peer, peer.sealed_next)
            applied += self._read(self.peers[peer.owner])
        return applied

    def _ours(self, h: mf.Header, peer: PeerLog) -> bool:
        return (
            h.fingerprint == self.fingerprint
            and h.daemon == peer.owner
            and h.generation == peer.generation
        )


def _read_from(fd: int, offset: int) -> bytes:
    page = offset // 4096 * 4096
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, page, 0, os.POSIX_FADV_DONTNEED)
    chunks = []
    pos = offset
    while True:
        try:
            b = os.pread(fd, _READ_BYTES, pos)
        except OSError as e:
            log.warning("manifest read failed at %d: %s", pos, e)
            break
        if not b:
            break
        chunks.append(b)
        pos += len(b)
        if len(b) < _READ_BYTES:
            break
    return b"".join(chunks)


def _close(peer: PeerLog) -> None:
    if peer.fd is not None:
        with contextlib.suppress(OSError):
            os.close(peer.fd)
        peer.fd = None
