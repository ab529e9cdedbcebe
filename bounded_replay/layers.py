"""What bounded replay needs to know of a model: which layers slide, and how far they see."""

from __future__ import annotations

from dataclasses import dataclass

from bounded_replay.errors import ReplayError


@dataclass(frozen=True, slots=True)
class LayerLayout:
    """Per layer, the sliding window in tokens (transformers' convention: key ``j`` is
    visible to query ``i`` iff ``i − j < window``), or ``None`` for full attention."""

    layer_windows: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if not self.layer_windows:
            raise ReplayError("a model has at least one layer")
        for i, w in enumerate(self.layer_windows):
            if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
                raise ReplayError(f"layer {i}: window must be a positive int or None, got {w!r}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_windows)

    @property
    def all_layers(self) -> tuple[int, ...]:
        return tuple(range(self.num_layers))

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w is None)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w is not None)

    @property
    def is_hybrid(self) -> bool:
        """Both kinds present: the only layout where the sliding layers' KV can be kept
        apart from the full layers' (and bounded replay means anything)."""
        return bool(self.full_layers) and bool(self.sliding_layers)

    @property
    def max_window_tokens(self) -> int:
        """The largest sliding window (0 without sliding layers)."""
        return max((w for w in self.layer_windows if w is not None), default=0)

    def window_first_block(self, hit_blocks: int, block_tokens: int) -> int:
        """The first block holding a key that the first token after a hit of ``hit_blocks``
        blocks (position ``hit_blocks · B``) sees in some sliding layer: later queries see
        only later keys, so the sliding KV of blocks before this one is never read."""
        if hit_blocks <= 0 or not self.sliding_layers:
            return max(0, hit_blocks)
        first_visible = hit_blocks * block_tokens - self.max_window_tokens + 1
        return max(0, first_visible) // block_tokens
