"""Index reads and removals shared by the tier's calls: presence with lazy expiry, a
get's and a put's look-ups in two steps, quarantine of a block that failed its checks,
and namespace-wide deletion."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

from kvstore.errors import InvalidArgument
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.index import Index, Location
from storage_nodes.ssd.recency import Recency, Stamp

_DELETE_BATCH = 10_000


class LiveIndex:
    """The index as the tier's calls use it: reads see only live blocks (expired ones are
    misses before the sweeper removes them); removals quarantine one block or delete a
    namespace."""

    def __init__(self, config: SSDConfig, index: Index, recency: Recency) -> None:
        self._config = config
        self._index = index
        self._recency = recency

    def expiry(self) -> int:
        return self._config.expiry_bucket(self._config.clock())

    def live(self, fkey: bytes, loc: Location, expiry: int) -> bool:
        """Present and not idle past retention: expired blocks are misses even before
        the sweeper removes them (DESIGN §10 expires them before the lookup)."""
        if loc.bucket >= expiry:
            return True
        pend = self._recency.pending_stamp(fkey)
        return pend is not None and pend[0] >= expiry

    def present_prefix(self, fkeys: Sequence[bytes]) -> list[Location]:
        expiry = self.expiry()
        out: list[Location] = []
        with self._index.begin() as txn:
            for fk in fkeys:
                loc = self._index.get(txn, fk)
                if loc is None or not self.live(fk, loc, expiry):
                    break
                out.append(loc)
        return out

    def present_set(self, fkeys: Sequence[bytes]) -> set[int]:
        expiry = self.expiry()
        out = set()
        with self._index.begin() as txn:
            for i, fk in enumerate(fkeys):
                loc = self._index.get(txn, fk)
                if loc is not None and self.live(fk, loc, expiry):
                    out.add(i)
        return out

    def quarantine(self, fkey: bytes, loc: Location, reason: bytes) -> bool:
        """Remove ``fkey`` and quarantine its slot if the index still points it at this
        very block (same slot, same generation). ``False``: the block was evicted and
        its slot reused while we read it — a race, not corruption."""
        with self._index.write() as txn:
            cur = self._index.get(txn, fkey)
            if cur is None or (cur.slab, cur.slot, cur.gen) != (loc.slab, loc.slot, loc.gen):
                return False
            self._index.remove(txn, fkey, cur, reason=reason)
            return True

    def delete_namespace(self, fingerprint: bytes) -> int:
        total = 0
        while True:
            with self._index.write() as txn:
                batch = list(islice(self._index.iter_namespace(txn, fingerprint), _DELETE_BATCH))
                for fk in batch:
                    loc = self._index.get(txn, fk)
                    if loc is not None:
                        self._index.remove(txn, fk, loc)
            total += len(batch)
            if len(batch) < _DELETE_BATCH:
                return total

    def count_of(self, fingerprint: bytes) -> int:
        """Blocks of one namespace in the index (a cursor walk over its keys)."""
        with self._index.begin() as txn:
            return sum(1 for _ in self._index.iter_namespace(txn, fingerprint))

    def keys_of(self, fingerprint: bytes) -> list[bytes]:
        with self._index.begin() as txn:
            return [fk[16:] for fk in self._index.iter_namespace(txn, fingerprint)]


class PrefixLookup:
    """A get's look-up in two steps, so that most of it runs while the first reads are in
    flight: ``first``, the locations of the present prefix of the first ``first_keys``
    keys, looked up at once; ``rest()``, those of the present keys after them. ``more``
    (``BlockIO.read_prefix``'s) is ``rest`` when ``first`` found all it looked up and
    keys remain, else None.

    ``rest`` also notes the access of every key located, before their reads complete, so
    that bookkeeping overlaps the I/O too: a block whose read then fails keeps the touch
    (recency only; a quarantined block's is dropped at the flush, its key being gone).
    ``noted`` says whether it did; if not, the caller notes the blocks it served."""

    def __init__(
        self, view: LiveIndex, recency: Recency, fkeys: Sequence[bytes], first_keys: int
    ) -> None:
        self._view, self._recency, self._fkeys = view, recency, fkeys
        self.first = view.present_prefix(fkeys[:first_keys])
        grows = len(self.first) == first_keys < len(fkeys)
        self.more: Callable[[], list[Location]] | None = self.rest if grows else None
        self.noted = False

    def rest(self) -> list[Location]:
        tail = self._view.present_prefix(self._fkeys[len(self.first) :])
        n = len(self.first) + len(tail)
        self._recency.note(self._fkeys[:n], self._recency.stamps(n))
        self.noted = True
        return tail


class PutLookup:
    """A put's look-up of which of its keys are stored already, in two steps as a get's
    (``PrefixLookup``): the first ``ahead`` keys at once — those its first writes carry —
    and the rest (``later``, called once) while those writes are in flight, so that the
    look-up of a large put (~20 µs for 32 keys) no longer comes before the device's first
    write. Keys found present are noted as accessed and not written again; ``absent``
    lists the rows to store, in order, and grows when ``later`` runs. ``stamps``: the
    put's recency stamps, last→first (key 0 ends up most recent)."""

    def __init__(
        self,
        view: LiveIndex,
        recency: Recency,
        fkeys: Sequence[bytes],
        ahead: int,
        present_ok: bool = True,
    ) -> None:
        self._view, self._recency, self._fkeys, self._ahead = view, recency, fkeys, ahead
        found = view.present_set(fkeys[:ahead])
        if found and not present_ok:
            raise InvalidArgument("put: key already present and present_ok=False")
        self.stamps: list[Stamp] = recency.stamps(len(fkeys))
        self.present: list[int] = []
        self.absent: list[int] = []
        #: whether the keys after ``ahead`` are still to be looked up
        self.pending = ahead < len(fkeys)
        self._sort(0, ahead, found)

    def later(self) -> list[int]:
        """The rows after the first ``ahead`` that are to be stored (looked up now)."""
        found = self._view.present_set(self._fkeys[self._ahead :])
        self.pending = False
        return self._sort(self._ahead, len(self._fkeys), found)

    @property
    def unknown(self) -> int:
        """Rows never looked up (``later`` not called, or failed)."""
        return len(self._fkeys) - self._ahead if self.pending else 0

    def _sort(self, lo: int, hi: int, found: set[int]) -> list[int]:
        """Rows ``lo:hi`` into present and absent (``found``: those present, from lo)."""
        hit = [lo + j for j in sorted(found)]
        if hit:
            self._recency.note([self._fkeys[i] for i in hit], [self.stamps[i] for i in hit])
        self.present += hit
        miss = [i for i in range(lo, hi) if i - lo not in found]
        self.absent += miss
        return miss
