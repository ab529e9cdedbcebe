"""One request of the hit-rate model (DESIGN §10)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """``(time, input_tokens L, block keys [b_1 … b_n], block_tokens B)``.

    ``keys`` are already scoped to the request's namespace by the reader (equal keys mean the
    same cached block), so the simulator needs no namespace field. Block ``i`` (from 1) weighs
    ``min(B, L − (i−1)B)`` tokens, clipped at 0: keys past ``L`` never count.

    ``session`` names the conversation the request belongs to where the format has one
    (kv-cache-tester: the session file's name); only routing (``routing.py``) reads it.
    """

    time_s: float
    input_tokens: int
    keys: Sequence[Hashable]
    block_tokens: int
    session: str | None = None

    def block_weight(self, index: int) -> int:
        """Tokens of the block at 0-based ``index``."""
        b = self.block_tokens
        return max(0, min(b, self.input_tokens - index * b))

    def prefix_tokens(self, blocks: int) -> int:
        """Tokens covered by the first ``blocks`` blocks (the hit tokens of a ``blocks`` hit)."""
        return min(blocks * self.block_tokens, self.input_tokens) if blocks > 0 else 0
