"""The tier interface and the engine-facing store interface (DESIGN §5, normative).

``Tier`` is one level of the hierarchy (DRAM, the SSD engine, the cluster client).
``KVStore`` is what an engine talks to: the embedded ``TierManager`` and the gRPC
client implement it with the same semantics, and one conformance suite
(``tests/conformance``) runs against every implementation.

Contract shared by every method that takes ``keys``:

* ``keys`` is (a slice of) one chain from ``chain_keys``; order matters.
* Recency changes only in ``get_into``, ``put``, ``touch`` and ``commit``, always
  applied last→first so the head of a prefix ends up most recent and a chain is
  evicted tail first. ``contains``/``lookup`` never change recency.
* A miss is a return value (a shorter prefix), never an exception.
* Misuse (unregistered namespace, wrong buffer size, bad keys) raises ``ValueError``
  subclasses from ``kvstore.errors`` and stores nothing.

End-to-end checksums (DESIGN §4): every block keeps the xxh3-64 of its payload made when
it was first committed, in every tier and on the wire, and is checked against it where
its bytes are handed over — after the copy into the destination, so the check reads
what the caller gets. A block that fails is a miss (the served prefix ends before it),
counted in ``corrupt_blocks_total``, never data. ``get_into(..., checksums=list)``
hands the stored checksums of the copied rows to a caller that passes the rows on (the
daemon puts them on the wire; the manager keeps them when it promotes), and
``put(..., checksums=...)`` stores given checksums instead of computing new ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from kvstore.keys import Key, Namespace

TierName = Literal["hbm", "dram", "ssd"]
Durability = Literal["dram", "ssd"]


@dataclass(frozen=True, slots=True)
class PutResult:
    """What ``Tier.put`` did with each row: inserted, already present (touched only) or
    dropped (no room, tier degraded)."""

    inserted: int = 0
    present: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class SizeClassStats:
    block_bytes: int
    capacity_blocks: int
    used_blocks: int


@dataclass(frozen=True, slots=True)
class TierStats:
    name: str
    capacity_bytes: int
    used_bytes: int
    size_classes: tuple[SizeClassStats, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict)
    info: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "capacity_bytes": self.capacity_bytes,
            "used_bytes": self.used_bytes,
            "size_classes": [
                {
                    "block_bytes": c.block_bytes,
                    "capacity_blocks": c.capacity_blocks,
                    "used_blocks": c.used_blocks,
                }
                for c in self.size_classes
            ],
            "counters": dict(self.counters),
            "info": dict(self.info),
        }


@dataclass(frozen=True, slots=True)
class LookupResult:
    """``hit_blocks`` = longest present prefix; ``tiers[i]`` = fastest tier holding block i."""

    hit_blocks: int
    tiers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CommitResult:
    inserted: int = 0
    present: int = 0
    dropped: int = 0
    durability: Durability = "dram"


@dataclass(frozen=True, slots=True)
class StoreStats:
    tiers: tuple[TierStats, ...]
    counters: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"tiers": [t.to_dict() for t in self.tiers], "counters": dict(self.counters)}


class Tier(ABC):
    """One level of the block hierarchy.

    Implementations must be thread-safe: the tier manager's flusher and prefetcher
    call them from background threads while the engine calls from its own.
    """

    name: str

    @abstractmethod
    def register(self, ns: Namespace) -> None:
        """Make ``ns`` usable (allocating its size class). Idempotent."""

    @abstractmethod
    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        """Length of the longest prefix of ``keys`` present. No side effects."""

    @abstractmethod
    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        checksums: list[int] | None = None,
    ) -> int:
        """Copy the longest present prefix into rows of ``dst`` (``len(keys) × block_bytes``
        writable bytes), touch those blocks last→first, return how many were copied.
        Rows past the returned count are left unspecified.

        Every returned row was checked against its stored checksum after it landed in
        ``dst``; a block that fails ends the prefix (counted, and dropped from the tier
        when its stored copy is the bad one). With ``checksums``, the stored checksum of
        each returned row is appended to it, in row order."""

    @abstractmethod
    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        """Insert row ``i`` of ``src`` (``len(keys) × block_bytes``) under ``keys[i]``; keys
        already present are only touched (``present_ok=False`` makes that a ValueError).
        Applied last→first.

        ``checksums[i]`` (one per key) is row ``i``'s checksum as made at commit; the tier
        stores it as given, so a row damaged since is caught on read. ``None``: the tier
        computes them from ``src``."""

    def sync(self, *, timeout_s: float | None = None) -> bool:
        """Make every block this tier acknowledged so far durable against power loss.
        False: some could not be (an I/O error, counted and handled as the tier's own
        failure; reported once); ``StoreUnavailable`` when ``timeout_s`` passes first.
        This default: a put is already as durable as the tier gets when it returns, so
        there is nothing to wait for (the SSD engine syncs its data behind its puts and
        overrides it)."""
        return True

    @abstractmethod
    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        """Refresh recency of the present keys, last→first; absent keys are ignored."""

    @abstractmethod
    def delete_namespace(self, ns: Namespace) -> int:
        """Drop every block of ``ns``; return how many were dropped. ``ns`` stays registered."""

    @abstractmethod
    def stats(self) -> TierStats:
        """Counters and capacity in blocks per size class."""

    def namespace_blocks(self, fingerprints: Collection[bytes]) -> Mapping[bytes, int] | None:
        """Blocks held per namespace fingerprint (for a tenant's own stats), or ``None``
        when this tier cannot count them."""
        return None

    def block_footprint(self, block_bytes: int) -> int:
        """Bytes one block of ``block_bytes`` occupies here, as ``stats().used_bytes``
        counts it (a tenant's usage is its blocks times this). This default: the payload;
        a tier that stores a header or pads blocks says so."""
        return block_bytes

    @abstractmethod
    def check_integrity(self) -> None:
        """Re-derive all accounting from first principles; raise ``IntegrityError``."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; later calls raise ``StoreUnavailable``. Idempotent."""

    def __enter__(self) -> Tier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KVStore(ABC):
    """The engine-facing store. Every call takes ``timeout_s`` (``None`` = no deadline).

    A store that cannot answer raises ``StoreUnavailable``; engines treat it as a miss.
    """

    @abstractmethod
    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        """Make ``ns`` usable in every tier. Idempotent."""

    @abstractmethod
    def lookup(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> LookupResult:
        """Longest prefix present in the union of the tiers, with the fastest tier of each
        hit block. No side effects (recency included)."""

    @abstractmethod
    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        """Copy the longest present prefix into ``dst`` rows; promotes lower-tier hits to the
        top tier; touches last→first. Returns blocks copied.

        Every returned row was verified against the checksum made at commit after it was
        copied into ``dst``; a corrupt block ends the prefix and is counted
        (``corrupt_blocks_total``). With ``checksums``, each returned row's stored
        checksum is appended to it."""

    @abstractmethod
    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        """Insert ``payloads[i]`` under ``keys[i]`` for the given indices, then touch the whole
        chain last→first. Returns once the blocks are in DRAM (``durability="dram"``) or on
        SSD (``"ssd"``). The result's durability holds for *every* block the commit stored
        (inserted or already present; ``dropped`` ones are stored nowhere): ``"ssd"`` only
        once the SSD accepted each of them; if it refused any, or the deadline passed
        first, ``"dram"``."""

    @abstractmethod
    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        """Start promoting the longest present prefix to the top tier in the background;
        the future resolves to the prefix length now in the top tier."""

    @abstractmethod
    def flush(self, *, timeout_s: float | None = None) -> None:
        """Return once every block accepted before the call is durable on the lowest tier.

        Raises ``NotDurable`` (with the count) when the lowest tier refused some of them
        (failing, read-only, degraded): each refused block is reported by one ``flush``,
        the first to return after the refusal. ``StoreUnavailable`` when the deadline
        passes first."""

    @abstractmethod
    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        """Drop every block of ``ns`` from every tier."""

    @abstractmethod
    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        """Per-tier stats plus store-level counters."""

    @abstractmethod
    def close(self) -> None:
        """Flush what can be flushed and release resources. Idempotent."""

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
