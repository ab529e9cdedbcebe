"""Per-capacity hit accounting of one swept tier, from stack depths (see ``sweep``)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Container, Hashable, Sequence
from itertools import accumulate

from kvstore.hitrate.config import TIER_NAMES, SimConfig, is_absent
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult, TierResult
from kvstore.hitrate.stackdist import LruStack
from kvstore.units import Capacity


class SweepAccumulator:
    """For swept tier ``x`` at capacities ``caps[0] < caps[1] < …`` (blocks):

    a block is present in the union of tiers at capacity C iff it is in a fixed tier or its
    depth in ``x`` is <= C; the request hits block j iff ``m_j`` (running max over the chain
    of 0 for blocks in a fixed tier, else the depth) is <= C. Its tier: a faster fixed tier
    holding it (from ``m_j``), else ``x`` (from ``max(m_j, depth)``), else the first slower
    fixed tier holding it (from ``m_j`` up to ``max(m_j, depth)``). Each of these is a step
    at a capacity index, kept in difference arrays and summed at the end.
    """

    def __init__(
        self, config: SimConfig, tier: str, points: Sequence[Capacity], block_tokens: int
    ) -> None:
        self.tier = tier
        self.x = TIER_NAMES.index(tier)
        self.points = list(points)
        self.caps = [
            0 if is_absent(c) else c.blocks(block_tokens, config.bytes_per_token) for c in points
        ]
        self.keep = config.replay_keep_tokens
        retention = config.retention_s if tier == "ssd" else math.inf
        self.stack = LruStack(max(self.caps), retention)
        n = len(self.caps) + 1  # the last slot collects "never within a swept capacity"
        self.tok = [[0] * n for _ in TIER_NAMES]
        self.blk = [[0] * n for _ in TIER_NAMES]
        self.ratio = [0.0] * n
        self.replay = [0] * n

    def account(
        self,
        req: Request,
        membership: tuple[Container[Hashable], Container[Hashable], Container[Hashable]],
        now_s: float,
    ) -> None:
        self.stack.expire(now_s)
        x, caps, depth = self.x, self.caps, self.stack.depth
        cmax = caps[-1]
        faster = [(i, membership[i]) for i in range(x)]
        slower = [(i, membership[i]) for i in range(x + 1, 3)]
        tok, blk = self.tok, self.blk
        b, big_l = req.block_tokens, req.input_tokens
        steps: list[tuple[int, int]] = []  # (capacity index, tokens) of each hit block
        m = 0.0
        for j, k in enumerate(req.keys):
            fast = next((i for i, p in faster if k in p), None)
            slow = next((i for i, p in slower if k in p), None) if fast is None else None
            d = depth(k)
            if fast is None and slow is None and d > m:
                m = d
            if m > cmax:
                break
            w = max(0, min(b, big_l - j * b))
            pm = bisect_left(caps, m)
            steps.append((pm, w))
            if fast is not None:
                tok[fast][pm] += w
                blk[fast][pm] += 1
                continue
            px = bisect_left(caps, max(m, d)) if d <= cmax else len(caps)
            tok[x][px] += w
            blk[x][px] += 1
            if slow is not None and px > pm:
                tok[slow][pm] += w
                tok[slow][px] -= w
                blk[slow][pm] += 1
                blk[slow][px] -= 1
        if not steps:
            return
        hit = 0
        for pm, w in steps:  # pm never decreases along the chain
            before = hit
            hit += w
            if big_l > 0:
                self.ratio[pm] += w / big_l
            self.replay[pm] += min(self.keep, hit) - min(self.keep, before)

    def commit(self, req: Request, now_s: float) -> None:
        keys = req.keys if isinstance(req.keys, list) else list(req.keys)
        self.stack.commit(keys, now_s)

    def results(self, base: SimResult) -> list[SimResult]:
        """One result per capacity, sharing the base run's request and token totals."""
        tok = [list(accumulate(row)) for row in self.tok]
        blk = [list(accumulate(row)) for row in self.blk]
        ratio = list(accumulate(self.ratio))
        replay = list(accumulate(self.replay))
        out = []
        for p, (cap, cap_blocks) in enumerate(zip(self.points, self.caps, strict=True)):
            tiers = []
            for i, name in enumerate(TIER_NAMES):
                bt = base.tiers[i]
                tiers.append(
                    TierResult(
                        name=name,
                        hit_tokens=tok[i][p],
                        hit_blocks=blk[i][p],
                        capacity_blocks=cap_blocks if i == self.x else bt.capacity_blocks,
                        present=(not is_absent(cap)) if i == self.x else bt.present,
                    )
                )
            out.append(
                SimResult(
                    requests=base.requests,
                    input_tokens=base.input_tokens,
                    hit_tokens=sum(t.hit_tokens for t in tiers),
                    ratio_sum=ratio[p],
                    ratio_requests=base.ratio_requests,
                    replay_extra_tokens=replay[p],
                    block_tokens=base.block_tokens,
                    tiers=tuple(tiers),
                )
            )
        return out
