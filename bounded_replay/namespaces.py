"""What the store keeps under a policy: one namespace per stored layer group (DESIGN §3).

The block format carries a namespace's whole ``cached_layers``, so layers that are loaded
apart live in namespaces apart: exact mode for a hybrid model keeps the full-attention
layers (loaded for the whole hit) and the sliding layers (loaded only for the last window)
in two namespaces of the same chain of tokens. Bounded mode keeps the full-attention layers
only, in a namespace whose ``model_revision`` also names the replay (``+bounded-keepN``),
because blocks computed after a replay carry its drift: they never mix with exact blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bounded_replay.errors import ReplayError
from bounded_replay.policy import ReplayPolicy
from kvstore.keys import Namespace


@dataclass(frozen=True, slots=True)
class StoredNamespaces:
    """``primary``: the chain every hit is looked up in (and the engine's pool indexes).
    ``sliding``: exact mode for a hybrid model, the sliding layers; else None."""

    primary: Namespace
    sliding: Namespace | None

    @property
    def all(self) -> tuple[Namespace, ...]:
        return (self.primary,) if self.sliding is None else (self.primary, self.sliding)

    @property
    def block_bytes(self) -> int:
        """Payload bytes the store keeps per block of tokens, over every namespace."""
        return sum(ns.block_bytes for ns in self.all)

    @property
    def bytes_per_token(self) -> float:
        return self.block_bytes / self.primary.block_tokens


def stored_namespaces(base: Namespace, policy: ReplayPolicy) -> StoredNamespaces:
    """The namespaces of ``base`` (a namespace whose ``cached_layers`` are every layer of
    the model) that the store keeps under ``policy``."""
    if tuple(base.cached_layers) != policy.layout.all_layers:
        raise ReplayError(f"the base namespace caches layers {base.cached_layers}, not the "
                          f"model's {policy.layout.num_layers} layers")
    groups = policy.stored_layer_groups
    revision = base.model_revision + policy.revision_tag()
    made = [replace(base, cached_layers=g, model_revision=revision) for g in groups]
    return StoredNamespaces(made[0], made[1] if len(made) > 1 else None)
