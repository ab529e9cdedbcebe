"""Write-back from the top tier to the tiers below it (DESIGN §6).

``commit`` returns once blocks are in DRAM; the write-back carries them to SSD in the
background. Dirty bytes are bounded: past ``max_dirty_bytes`` a commit waits for the
flusher (back-pressure, counted) until its deadline, then the blocks that still do not
fit are refused and counted — never silently lost.

Acknowledgements tell the truth: a batch is durable only for the blocks every lower tier
accepted (inserted, or already held). What a lower tier refuses — it raised, is
read-only, degraded or full — is counted per batch on its ``Ticket`` (so a commit that
asked for ``durability="ssd"`` learns it did not get it) and kept in a refusal log that
``flush`` claims (so the flush that covers a refused block reports it, once).

Blocks travel with the checksums made at commit, so the lower tiers store those and
not a checksum of the write-back copy (DESIGN §4).

This module holds the contract (``WriteBack``, its ``Ticket``) and ``NullWriteBack``, the
single-tier case: nothing below, so nothing is ever dirty. The flusher threads that do
the work are ``kvstore.writeback_thread.ThreadWriteBack``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.keys import Key, Namespace


@dataclass(slots=True)
class Ticket:
    """One submitted batch. ``refused`` is set once the batch is done: how many of its
    blocks some lower tier did not accept."""

    seq: int
    blocks: int
    refused: int = 0


class WriteBack(ABC):
    """Contract: ``reserve`` waits until ``n_blocks`` of ``block_bytes`` fit under the dirty
    bound or the deadline passes, and returns how many blocks were granted; ``submit``
    hands over exactly the granted blocks (with their checksums) and returns a ``Ticket``;
    ``wait(seq)`` blocks until every batch up to ``seq`` is done (or the deadline), after
    which each of those tickets states how many of its blocks were refused below.
    ``last_ticket`` is the newest sequence number handed out, which ``flush`` waits for;
    ``claim_refused(seq)`` returns (and forgets) the refusals of done batches up to
    ``seq`` that no earlier claim returned. ``sync_lower`` makes what the lower tiers
    acknowledged so far durable against power loss (``Tier.sync``) and returns how many
    written-back blocks it could not vouch for (0: all durable); a deadline that passes
    first raises ``StoreUnavailable``."""

    counters: Counter[str]

    @abstractmethod
    def reserve(self, n_blocks: int, block_bytes: int, deadline_s: float | None) -> int: ...

    @abstractmethod
    def last_ticket(self) -> int: ...

    @abstractmethod
    def submit(
        self, ns: Namespace, keys: Sequence[Key], data: memoryview, checksums: Sequence[int]
    ) -> Ticket: ...

    @abstractmethod
    def wait(self, ticket: int, deadline_s: float | None) -> bool: ...

    @abstractmethod
    def claim_refused(self, ticket: int) -> int: ...

    @abstractmethod
    def sync_lower(self, deadline_s: float | None) -> int: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Re-derive the bookkeeping; raise ``IntegrityError``."""

    @abstractmethod
    def note_hits(self, ns: Namespace, keys: Sequence[Key]) -> None:
        """Blocks served from the top tier: refresh their lower copies' retention soon."""

    @abstractmethod
    def dirty_bytes(self) -> int: ...

    @abstractmethod
    def close(self, deadline_s: float | None) -> None: ...

    @property
    def durable_level(self) -> str:
        return "ssd"


class NullWriteBack(WriteBack):
    def __init__(self) -> None:
        self.counters = Counter()

    def reserve(self, n_blocks: int, block_bytes: int, deadline_s: float | None) -> int:
        return n_blocks

    def last_ticket(self) -> int:
        return 0

    def submit(
        self, ns: Namespace, keys: Sequence[Key], data: memoryview, checksums: Sequence[int]
    ) -> Ticket:
        return Ticket(0, len(keys))

    def wait(self, ticket: int, deadline_s: float | None) -> bool:
        return True

    def claim_refused(self, ticket: int) -> int:
        return 0

    def sync_lower(self, deadline_s: float | None) -> int:
        return 0

    def check_integrity(self) -> None:
        pass  # nothing is ever held

    def note_hits(self, ns: Namespace, keys: Sequence[Key]) -> None:
        pass

    def dirty_bytes(self) -> int:
        return 0

    def close(self, deadline_s: float | None) -> None:
        pass

    @property
    def durable_level(self) -> str:
        return "dram"
