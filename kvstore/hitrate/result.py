"""Typed results of a replay: totals, per-tier hits, and the derived rates."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierResult:
    """Hits attributed to one tier (the fastest holding each hit block)."""

    name: str
    hit_tokens: int
    hit_blocks: int
    capacity_blocks: float  # math.inf when unbounded, 0 when absent
    present: bool


@dataclass(frozen=True, slots=True)
class SimResult:
    """Totals of one replay. ``ratio_sum`` / ``ratio_requests`` is the mean request hit ratio
    (requests with ``L = 0`` have no ratio and are left out of that mean only)."""

    requests: int
    input_tokens: int
    hit_tokens: int
    ratio_sum: float
    ratio_requests: int
    replay_extra_tokens: int  # Σ over hit requests of min(keep, hit tokens)
    block_tokens: int
    tiers: tuple[TierResult, ...]

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def mean_request_hit_ratio(self) -> float:
        return self.ratio_sum / self.ratio_requests if self.ratio_requests else 0.0

    @property
    def computed_tokens(self) -> int:
        return self.input_tokens - self.hit_tokens

    @property
    def computed_tokens_with_replay(self) -> int:
        return self.computed_tokens + self.replay_extra_tokens

    def tier(self, name: str) -> TierResult:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, object]:
        """The JSON body DESIGN §10 / the issue promise (cost is added by the report)."""
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "mean_request_hit_ratio": self.mean_request_hit_ratio,
            "computed_tokens": self.computed_tokens,
            "computed_tokens_with_replay": self.computed_tokens_with_replay,
            "block_tokens": self.block_tokens,
            "tiers": {
                t.name: {
                    "hit_tokens": t.hit_tokens,
                    "hit_blocks": t.hit_blocks,
                    # JSON has no infinity: an unbounded tier reports null.
                    "capacity_blocks": None
                    if math.isinf(t.capacity_blocks)
                    else int(t.capacity_blocks),
                    "present": t.present,
                }
                for t in self.tiers
            },
        }
