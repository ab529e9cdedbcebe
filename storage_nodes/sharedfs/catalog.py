"""One namespace as every daemon's manifests describe it: the index a reader consults.

``contains`` and the first step of ``get_into`` are lookups here, in memory: a 32 K
prompt (512 blocks of 64 tokens) costs no round trip to the file system, whatever the
number of daemons. The catalog is filled by the owner's own appends (at once) and by
tailing peers' manifests (within the visibility bound), so it may name a block that
its owner has since evicted and rewritten; the read path's header check turns that into
a counted miss.

A key may be held by several daemons (two hosts computed it before either saw the
other's copy): the first location is served, the others stand by.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kvstore.errors import IntegrityError


class Loc(NamedTuple):
    owner: str
    seg: int
    slot: int
    born_s: int


class Catalog:
    """Not thread-safe: the tier guards it with its lock."""

    def __init__(self) -> None:
        self.first: dict[bytes, Loc] = {}
        self.more: dict[bytes, list[Loc]] = {}
        self.access: dict[bytes, int] = {}  # latest access (s) published by any daemon
        self._slots: dict[str, dict[int, dict[int, bytes]]] = {}  # owner -> seg -> slot -> key

    def __len__(self) -> int:
        return len(self.first)

    # -- reads ------------------------------------------------------------------------
    def live(self, key: bytes, floor_s: float) -> bool:
        return key in self.first and self.access[key] >= floor_s

    def prefix(self, keys: Sequence[bytes], floor_s: float) -> list[Loc]:
        """Locations of the longest live prefix of ``keys``."""
        first, access = self.first, self.access
        out = []
        for k in keys:
            loc = first.get(k)
            if loc is None or access[k] < floor_s:
                break
            out.append(loc)
        return out

    def locations(self, key: bytes) -> list[Loc]:
        loc = self.first.get(key)
        return [] if loc is None else [loc, *self.more.get(key, ())]

    def key_at(self, owner: str, seg: int, slot: int) -> bytes | None:
        return self._slots.get(owner, {}).get(seg, {}).get(slot)

    def owners(self) -> list[str]:
        return sorted(o for o, segs in self._slots.items() if any(segs.values()))

    def keys_of(self, owner: str) -> Iterable[tuple[bytes, Loc]]:
        for seg, slots in self._slots.get(owner, {}).items():
            for slot, key in slots.items():
                for loc in self.locations(key):
                    if loc.owner == owner and loc.seg == seg and loc.slot == slot:
                        yield key, loc

    # -- updates ----------------------------------------------------------------------
    def put(self, key: bytes, loc: Loc, access_s: int) -> None:
        """``key`` is durable at ``loc``; whatever that slot held before is gone."""
        slots = self._slots.setdefault(loc.owner, {}).setdefault(loc.seg, {})
        old = slots.get(loc.slot)
        if old is not None:
            self._unlink(old, loc.owner, loc.seg, loc.slot)
        slots[loc.slot] = key
        cur = self.first.get(key)
        if cur is None:
            self.first[key] = loc
            self.access[key] = access_s
            return
        self.more.setdefault(key, []).append(loc)
        if access_s > self.access[key]:
            self.access[key] = access_s

    def drop(self, key: bytes, owner: str, seg: int, slot: int) -> bool:
        """Forget ``key`` at that slot only (a newer copy elsewhere stays)."""
        slots = self._slots.get(owner, {}).get(seg)
        if slots is None or slots.get(slot) != key:
            return False
        del slots[slot]
        self._unlink(key, owner, seg, slot)
        return True

    def drop_segment(self, owner: str, seg: int) -> list[bytes]:
        slots = self._slots.get(owner, {}).pop(seg, None) or {}
        for slot, key in slots.items():
            self._unlink(key, owner, seg, slot)
        return list(slots.values())

    def drop_owner(self, owner: str) -> int:
        segs = self._slots.pop(owner, None) or {}
        n = 0
        for seg, slots in segs.items():
            for slot, key in slots.items():
                self._unlink(key, owner, seg, slot)
                n += 1
        return n

    def touch(self, access_s: int, keys: Iterable[bytes]) -> None:
        access = self.access
        for k in keys:
            cur = access.get(k)
            if cur is not None and cur < access_s:
                access[k] = access_s

    def drop_born_before(self, t_s: int) -> list[tuple[bytes, Loc]]:
        """DELETE_NS: every copy born at or before ``t_s`` goes; returns what went."""
        gone = []
        for key in list(self.first):
            for loc in self.locations(key):
                if loc.born_s <= t_s:
                    self.drop(key, loc.owner, loc.seg, loc.slot)
                    gone.append((key, loc))
        return gone

    def _unlink(self, key: bytes, owner: str, seg: int, slot: int) -> None:
        """Remove one location of ``key`` (its reverse entry is already gone)."""
        cur = self.first.get(key)
        if cur is None:
            return
        extra = self.more.get(key)
        if cur.owner == owner and cur.seg == seg and cur.slot == slot:
            if extra:
                self.first[key] = extra.pop(0)
                if not extra:
                    del self.more[key]
            else:
                del self.first[key]
                del self.access[key]
            return
        if extra:
            extra[:] = [
                loc for loc in extra
                if not (loc.owner == owner and loc.seg == seg and loc.slot == slot)
            ]
            if not extra:
                del self.more[key]

    # -- checks -----------------------------------------------------------------------
    def check(self) -> None:
        if set(self.access) != set(self.first):
            raise IntegrityError("catalog access times and locations name different keys")
        if not set(self.more) <= set(self.first):
            raise IntegrityError("catalog holds spare copies of a key without a first one")
        forward = 0
        for key, loc in self.first.items():
            for x in [loc, *self.more.get(key, ())]:
                forward += 1
                if self.key_at(x.owner, x.seg, x.slot) != key:
                    raise IntegrityError(f"catalog location of {key.hex()} has no reverse entry")
        backward = sum(len(s) for segs in self._slots.values() for s in segs.values())
        if forward != backward:
            raise IntegrityError(f"catalog has {forward} locations but {backward} slot entries")
