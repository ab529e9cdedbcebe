"""What the pool tells the world about its prefix index: a block indexed (stored), a block
evicted (removed), the whole index dropped (cleared).

A router that scores replicas by the blocks they hold (vllm-router's ``kv_aware``) needs to
know each replica's pool; ``engine.server.kv_events`` turns these calls into vLLM's KV-events
wire format. The pool calls one ``BlockEventListener``: ``BlockEventListeners``, a registry
that fans out to whatever registered (nothing, by default: an empty registry is the null
listener, so the pool never asks whether anyone listens).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from kvstore.keys import Key


class BlockEventListener(ABC):
    """Told of every change to the pool's prefix index, in the order it happens.

    Contract: called on the engine thread, synchronously, inside the pool's bookkeeping —
    an implementation returns at once (it queues, it never does I/O), never raises, and
    never calls back into the pool. ``key`` is the block's chain key (DESIGN §3), which
    already covers every block before it, the namespace and the tenant.
    """

    @abstractmethod
    def stored(self, key: Key, parent: Key | None, token_ids: Sequence[int]) -> None:
        """``key`` was indexed: the pool now serves hits on it. ``parent`` is the chain key
        of the block before it (None for a chain's first block); ``token_ids`` are the
        block's own tokens (exactly one block's worth)."""

    @abstractmethod
    def removed(self, key: Key) -> None:
        """``key`` left the index (its block was evicted for reuse)."""

    @abstractmethod
    def cleared(self) -> None:
        """Every key left the index at once (a pool reset, or a fresh pool whose
        predecessor at the same address may have announced blocks it no longer has)."""


class NullBlockEventListener(BlockEventListener):
    """Hears nothing."""

    def stored(self, key: Key, parent: Key | None, token_ids: Sequence[int]) -> None:
        return None

    def removed(self, key: Key) -> None:
        return None

    def cleared(self) -> None:
        return None


class BlockEventListeners(BlockEventListener):
    """The pool's listener registry: forwards each call to every registered listener, in
    registration order. Empty, it is the null listener."""

    def __init__(self) -> None:
        self._listeners: list[BlockEventListener] = []

    def register(self, listener: BlockEventListener) -> None:
        if listener in self._listeners:
            raise ValueError(f"{listener!r} is already registered")
        self._listeners.append(listener)

    def unregister(self, listener: BlockEventListener) -> None:
        self._listeners.remove(listener)

    def __len__(self) -> int:
        return len(self._listeners)

    def stored(self, key: Key, parent: Key | None, token_ids: Sequence[int]) -> None:
        for listener in self._listeners:
            listener.stored(key, parent, token_ids)

    def removed(self, key: Key) -> None:
        for listener in self._listeners:
            listener.removed(key)

    def cleared(self) -> None:
        for listener in self._listeners:
            listener.cleared()
