"""What the pool's prefix index does, for whoever watches it: the hook point of KV events.

A block becomes *stored* when the pool indexes it under its chain key (a later request with
the same prefix can hit it), *removed* when the pool evicts it to reuse its memory, and
every block is *cleared* at once by ``BlockPool.reset_prefix_cache``. These are the events
vLLM's KV events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) report to a
router; a server that publishes them registers a ``KVEventListener`` with the engine's KV
manager (``KVManager.events.add``). Without one the registry calls nothing.

Listeners run on the engine thread, inside the pool's bookkeeping: they must be quick and
must not call back into the pool (queue the event and publish it elsewhere). A listener
that raises breaks the step that fired it, as any engine bug does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from kvstore.keys import Key


class KVEventListener(ABC):
    """Observes the pool's prefix index. Each event names the pool block and the chain key
    (DESIGN §3: the same key the store uses for that block)."""

    @abstractmethod
    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        """Block ``block_id`` is now indexed under ``key``, holding the K/V of ``layers``
        (every layer when this engine computed it; the stored layers when it was loaded).
        ``parent`` is the chain key of the block before it (None for a chain's first block)
        and ``token_ids`` the block's own tokens (exactly one block's worth): a router
        matches prompts on tokens and chains blocks by their parent, never on the keys
        alone."""

    @abstractmethod
    def block_removed(self, block_id: int, key: Key) -> None:
        """Block ``block_id`` left the index (evicted for reuse): ``key`` no longer hits."""

    @abstractmethod
    def all_cleared(self) -> None:
        """Every block left the index at once."""


class NullKVEventListener(KVEventListener):
    """The default: nobody watches."""

    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        pass

    def block_removed(self, block_id: int, key: Key) -> None:
        pass

    def all_cleared(self) -> None:
        pass


class KVEventListeners(KVEventListener):
    """The registry: a listener that passes each event to every registered one, in the
    order they were added (none registered: it does nothing)."""

    def __init__(self) -> None:
        self._listeners: list[KVEventListener] = []

    def add(self, listener: KVEventListener) -> None:
        """Register ``listener``; twice would tell it every event twice, so it is refused."""
        if listener in self._listeners:
            raise ValueError(f"{listener!r} is already registered")
        self._listeners.append(listener)

    def remove(self, listener: KVEventListener) -> None:
        self._listeners.remove(listener)

    def __len__(self) -> int:
        return len(self._listeners)

    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        for listener in self._listeners:
            listener.block_stored(block_id, key, layers, parent, token_ids)

    def block_removed(self, block_id: int, key: Key) -> None:
        for listener in self._listeners:
            listener.block_removed(block_id, key)

    def all_cleared(self) -> None:
        for listener in self._listeners:
            listener.all_cleared()
