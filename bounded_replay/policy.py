"""The replay policy of one engine: exact or bounded, ``keep``, and what the store keeps.

Defaults are the safe ones (DESIGN §11):

- a hybrid model (sliding and full-attention layers) runs **exact** by default: the rule
  written before measuring (bounded_replay/README.md, last sections) kept bounded replay the
  default only within 2x the chunking noise floor at every measured context, and on Gemma 3
  270M in bfloat16 it is 4.9x at 2K and 9.6x at 8K (``bounded_replay.measured``);
- bounded replay is an opt-in (``keep_tokens`` N): the store keeps the full-attention layers
  of every block and, at each committed sequence end, the sliding layers of the blocks its
  last window reaches (the *window tail*); a hit at a tail replays nothing, any other hit
  replays the last ``keep`` tokens; ``default_keep_tokens`` = the largest window +
  ``KEEP_MARGIN_TOKENS`` (140 for a 128-token window) is its safe minimum;
- a ``keep`` below that minimum is refused unless forced: the sliding layers would rebuild
  the window from less than a whole window of context;
- ``keep = 0`` or ``cache_all_layers`` is **exact** mode: the store keeps every layer (for a
  hybrid model the full and the sliding layers in two namespaces, so a hit loads the sliding
  ones only for the last window's blocks) and a hit recomputes nothing it holds;
- a model with only full-attention layers has nothing to replay: exact, ``keep`` ignored;
- a model with no full-attention layer has nothing bounded mode could store: asked for
  explicitly, bounded mode is refused; by default such a model runs exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from bounded_replay.errors import KeepTooSmall, NoFullAttentionLayer, ReplayError
from bounded_replay.layers import LayerLayout

#: Tokens replayed beyond the largest window: the oldest key the first new token sees in a
#: sliding layer was itself computed with this many tokens of rebuilt context before it.
KEEP_MARGIN_TOKENS = 12


class ReplayMode(StrEnum):
    EXACT = "exact"
    BOUNDED = "bounded"


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    mode: ReplayMode
    keep_tokens: int  # tokens of the hit replayed (bounded); 0 in exact mode
    layout: LayerLayout
    reason: str  # why this mode: shown by the CLI next to the stored-bytes figure

    def __post_init__(self) -> None:
        if self.mode is ReplayMode.EXACT and self.keep_tokens != 0:
            raise ReplayError("exact mode replays nothing: keep_tokens must be 0")
        if self.mode is ReplayMode.BOUNDED:
            if self.keep_tokens < 1:
                raise ReplayError("bounded mode needs keep_tokens >= 1")
            if not self.layout.is_hybrid:
                raise ReplayError("bounded mode needs both sliding and full-attention layers")

    @property
    def is_bounded(self) -> bool:
        return self.mode is ReplayMode.BOUNDED

    @property
    def stored_layer_groups(self) -> tuple[tuple[int, ...], ...]:
        """The layers of each store namespace, the primary one first: every hit is looked up
        in the primary chain (and the pool indexes it). Hybrid (either mode): the
        full-attention layers, then the sliding ones apart (exact mode stores them for every
        block, bounded mode only for window tails: ``keeps_window_tails``). Otherwise: every
        layer in one namespace."""
        lay = self.layout
        if lay.is_hybrid:
            return (lay.full_layers, lay.sliding_layers)
        return (lay.all_layers,)

    @property
    def keeps_window_tails(self) -> bool:
        """Bounded mode: the sliding namespace holds, per committed sequence end, only the
        blocks its last window reaches (``tail_blocks``), not every block."""
        return self.is_bounded

    def tail_blocks(self, block_tokens: int) -> int:
        """Blocks of one window tail: those the first token after an end (of enough blocks)
        sees in some sliding layer, ``ceil((W − 1) / B)``; 0 unless ``keeps_window_tails``."""
        if not self.keeps_window_tails:
            return 0
        return -(-(self.layout.max_window_tokens - 1) // block_tokens)

    @property
    def primary_layers(self) -> tuple[int, ...]:
        return self.stored_layer_groups[0]

    @property
    def sliding_apart(self) -> tuple[int, ...]:
        """The sliding layers whose KV a hit needs from outside the primary namespace (only
        for the last window's blocks): every sliding layer of a hybrid model, none
        otherwise (without full layers the sliding ones are the primary namespace)."""
        return self.layout.sliding_layers if self.layout.is_hybrid else ()

    @property
    def stored_layer_fraction(self) -> float:
        """Share of a token's KV bytes the store keeps for every token (every layer has the
        same KV shape): bounded mode's window tails come on top, per committed end."""
        groups = self.stored_layer_groups[:1] if self.keeps_window_tails \
            else self.stored_layer_groups
        return sum(len(g) for g in groups) / self.layout.num_layers

    def max_replay_blocks(self, block_tokens: int) -> int:
        """The most hit blocks one replay writes into: ``keep`` tokens ending on a block
        boundary touch at most ``ceil(keep / B)`` blocks."""
        return -(-self.keep_tokens // block_tokens)

    def revision_tag(self) -> str:
        """Appended to every namespace's ``model_revision`` in bounded mode (the window
        tails' too): blocks computed after a replay carry its drift, so they never mix with
        exact blocks, nor with those of another ``keep``."""
        return f"+bounded-keep{self.keep_tokens}" if self.is_bounded else ""

    def describe(self) -> str:
        if self.is_bounded:
            return f"bounded replay, keep {self.keep_tokens} tokens ({self.reason})"
        return f"exact ({self.reason})"


def default_keep_tokens(layer_windows: Sequence[int | None]) -> int:
    """The largest sliding window + ``KEEP_MARGIN_TOKENS`` (0 without sliding layers)."""
    w = LayerLayout(tuple(layer_windows)).max_window_tokens
    return w + KEEP_MARGIN_TOKENS if w else 0


def resolve_policy(
    layer_windows: Sequence[int | None],
    keep_tokens: int | None = None,
    *,
    force: bool = False,
    cache_all_layers: bool = False,
) -> ReplayPolicy:
    """The policy for a model with these windows: ``keep_tokens`` None is the default,
    exact for every model (bounded replay is opt-in: ``keep_tokens`` N >= 1). Refusals
    raise ``ReplayRefused``."""
    layout = LayerLayout(tuple(layer_windows))
    if keep_tokens is not None and (isinstance(keep_tokens, bool) or keep_tokens < 0):
        raise ReplayError(f"--replay-keep must be a token count >= 0, got {keep_tokens}")
    if cache_all_layers:
        if keep_tokens:
            raise ReplayError("--cache-all-layers (exact mode) and --replay-keep "
                              f"{keep_tokens} (bounded mode) exclude each other")
        return ReplayPolicy(ReplayMode.EXACT, 0, layout, "every layer cached")
    if keep_tokens == 0:
        return ReplayPolicy(ReplayMode.EXACT, 0, layout, "keep 0: every layer cached")
    if keep_tokens is None and layout.is_hybrid:
        return ReplayPolicy(ReplayMode.EXACT, 0, layout, "default: every layer cached; "
                            "bounded replay is opt-in (--replay-keep N)")
    if not layout.sliding_layers:
        return ReplayPolicy(ReplayMode.EXACT, 0, layout,
                            "no sliding layers: nothing to replay, keep ignored")
    if not layout.full_layers:
        if keep_tokens is None:
            return ReplayPolicy(ReplayMode.EXACT, 0, layout,
                                "no full-attention layer: every layer cached")
        raise NoFullAttentionLayer(
            "bounded replay stores only full-attention layers and this model has none "
            "(every layer slides); drop --replay-keep to cache every layer"
        )
    safe = layout.max_window_tokens + KEEP_MARGIN_TOKENS
    keep = int(keep_tokens or 0)  # not None here: the default returned above
    if keep < safe and not force:
        raise KeepTooSmall(
            f"--replay-keep {keep} is below the safe minimum of {safe} tokens (largest "
            f"window {layout.max_window_tokens} + {KEEP_MARGIN_TOKENS}): the sliding layers "
            "would rebuild their window from less than a window of context; pass --force "
            "to accept the extra drift"
        )
    why = "--replay-keep"
    if keep < safe:
        why = "forced below the safe minimum"
    return ReplayPolicy(ReplayMode.BOUNDED, keep, layout, why)
