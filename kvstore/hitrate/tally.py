"""The DESIGN §10 totals of a replay, kept in one place.

The simulator adds what the model predicts and the load generator what a real store
served; both go through ``HitTally.add`` and ``HitTally.result``, so "measured equals
predicted" compares two results of the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import IntegrityError
from kvstore.hitrate.config import TIER_NAMES
from kvstore.hitrate.result import SimResult, TierResult


class HitTally:
    """Requests, input and hit tokens, the mean-ratio terms and per-tier hits. Not
    thread-safe: the owner locks if it shares one."""

    def __init__(self) -> None:
        self.requests = 0
        self.input_tokens = 0
        self.hit_tokens = 0
        self.ratio_sum = 0.0
        self.ratio_requests = 0
        self.replay_extra_tokens = 0
        self.tier_hit_blocks = [0, 0, 0]
        self.tier_hit_tokens = [0, 0, 0]

    def add(
        self,
        input_tokens: int,
        blocks: Sequence[int],
        tokens: Sequence[int],
        replay_keep_tokens: int,
    ) -> int:
        """One request: ``blocks[t]``/``tokens[t]`` hit in tier ``t`` (hbm, dram, ssd).
        Returns its hit tokens."""
        hit = tokens[0] + tokens[1] + tokens[2]
        for t in range(3):
            self.tier_hit_blocks[t] += blocks[t]
            self.tier_hit_tokens[t] += tokens[t]
        self.requests += 1
        self.input_tokens += input_tokens
        self.hit_tokens += hit
        if input_tokens > 0:  # L = 0 has no ratio: left out of the mean only
            self.ratio_sum += hit / input_tokens
            self.ratio_requests += 1
        if hit > 0:
            self.replay_extra_tokens += min(replay_keep_tokens, hit)
        return hit

    def result(
        self, block_tokens: int, capacity_blocks: Sequence[float], present: Sequence[bool]
    ) -> SimResult:
        """The totals as a ``SimResult``; ``capacity_blocks``/``present`` per tier."""
        return SimResult(
            requests=self.requests,
            input_tokens=self.input_tokens,
            hit_tokens=self.hit_tokens,
            ratio_sum=self.ratio_sum,
            ratio_requests=self.ratio_requests,
            replay_extra_tokens=self.replay_extra_tokens,
            block_tokens=block_tokens,
            tiers=tuple(
                TierResult(
                    name=name,
                    hit_tokens=self.tier_hit_tokens[i],
                    hit_blocks=self.tier_hit_blocks[i],
                    capacity_blocks=capacity_blocks[i],
                    present=present[i],
                )
                for i, name in enumerate(TIER_NAMES)
            ),
        )

    def check_integrity(self, owner: str) -> None:
        if sum(self.tier_hit_tokens) != self.hit_tokens:
            raise IntegrityError(f"{owner}: tier hit tokens do not add up to the total")
        if self.hit_tokens > self.input_tokens:
            raise IntegrityError(f"{owner}: more hit tokens than input tokens")
