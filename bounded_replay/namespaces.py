"""What the store keeps under a policy: one namespace per stored layer group (DESIGN §3).

The block format carries a namespace's whole ``cached_layers``, so layers that are loaded
apart live in namespaces apart: a hybrid model keeps the full-attention layers (loaded for
the whole hit) and the sliding layers (loaded only for the last window) in two namespaces
of the same chain of tokens. Exact mode fills the sliding one for every block; bounded mode
only with the *window tails*: at each committed sequence end, the blocks its last window
reaches. Bounded namespaces' ``model_revision`` also names the replay (``+bounded-keepN``),
because blocks computed after a replay carry its drift: they never mix with exact blocks.
The tails need no tag of their own: their namespace's ``cached_layers`` (the sliding
layers) already set it apart from the primary one, and a tail block holds what any block
of that chain holds, the sliding KV this bounded engine computed there; whether it is a
tail is only about which blocks were sent.

Bytes per token (``StoredNamespaces.bytes_per_token``): every token's primary layers (and
exact mode's sliding ones), plus in bounded mode one tail of ``tail_blocks`` blocks of
sliding layers per committed end: ``full + sliding × tail_tokens / context_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bounded_replay.errors import ReplayError
from bounded_replay.policy import ReplayPolicy
from kvstore.keys import Namespace


@dataclass(frozen=True, slots=True)
class StoredNamespaces:
    """``primary``: the chain every hit is looked up in (and the engine's pool indexes).
    ``sliding``: a hybrid model's sliding layers (exact mode: every block; bounded mode:
    ``tail_blocks`` per committed end); else None."""

    primary: Namespace
    sliding: Namespace | None
    tail_blocks: int = 0  # bounded mode: blocks of one window tail; 0: every block

    @property
    def all(self) -> tuple[Namespace, ...]:
        return (self.primary,) if self.sliding is None else (self.primary, self.sliding)

    @property
    def block_bytes(self) -> int:
        """Payload bytes the store keeps for every block of tokens (a bounded mode's tails
        are per committed end: ``tail_bytes``)."""
        every = self.all if not self.tail_blocks else (self.primary,)
        return sum(ns.block_bytes for ns in every)

    @property
    def tail_bytes(self) -> int:
        """Payload bytes of one committed end's window tail (0 without tails)."""
        if not self.tail_blocks or self.sliding is None:
            return 0
        return self.tail_blocks * self.sliding.block_bytes

    def bytes_per_token(self, context_tokens: int) -> float:
        """Bytes the store keeps per token of a context of ``context_tokens`` committed at
        one end: every token's blocks, plus that end's tail (at most the context's full
        blocks) spread over the context."""
        if context_tokens < 1:
            raise ReplayError(f"context_tokens must be >= 1, got {context_tokens}")
        bt = self.primary.block_tokens
        tail = min(self.tail_blocks, context_tokens // bt) * self.tail_bytes \
            // max(1, self.tail_blocks)
        return self.block_bytes / bt + tail / context_tokens


def stored_namespaces(base: Namespace, policy: ReplayPolicy) -> StoredNamespaces:
    """The namespaces of ``base`` (a namespace whose ``cached_layers`` are every layer of
    the model) that the store keeps under ``policy``."""
    if tuple(base.cached_layers) != policy.layout.all_layers:
        raise ReplayError(f"the base namespace caches layers {base.cached_layers}, not the "
                          f"model's {policy.layout.num_layers} layers")
    groups = policy.stored_layer_groups
    revision = base.model_revision + policy.revision_tag()
    made = [replace(base, cached_layers=g, model_revision=revision) for g in groups]
    return StoredNamespaces(made[0], made[1] if len(made) > 1 else None,
                            policy.tail_blocks(base.block_tokens))
