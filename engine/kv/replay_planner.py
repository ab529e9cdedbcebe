"""The engine's side of bounded replay: from a request's hit (its table's blocks and the
layers each holds) to a ``bounded_replay.ReplayPlan``.

A hit block always holds the primary namespace's layers (the pool indexes that chain). What
decides the plan is whether the blocks of the last window also hold the sliding layers:
blocks this engine computed do; for blocks from the store the loader copies the sliding
layers of the window's blocks in from their own namespace when the store has them. Exact
mode stores them for every block, and a hit whose window still lacks them is shortened
(``bounded_replay.longest_exact_hit``), never replayed. Bounded mode stores them only as
*window tails* (the last window of each committed sequence end): a hit at a tail (a
session's next turn) gets them and replays nothing; any other hit lacks them and replays,
never shortened.
"""

from __future__ import annotations

from collections.abc import Sequence

from bounded_replay import (
    ReplayPlan,
    ReplayPolicy,
    longest_exact_hit,
    plan_replay,
    window_is_cached,
)
from engine.kv.block_pool import KVBlock


class ReplayPlanner:
    def __init__(self, policy: ReplayPolicy, block_tokens: int) -> None:
        self.policy = policy
        self.block_tokens = block_tokens
        self.primary_layers = frozenset(policy.primary_layers)
        self.sliding_layers = frozenset(policy.sliding_apart)  # a hit block may lack these
        self.computed_layers = frozenset(policy.layout.all_layers)

    def has_sliding(self, block: KVBlock) -> bool:
        return self.sliding_layers <= block.layers

    def window_first_block(self, hit_blocks: int) -> int:
        return self.policy.layout.window_first_block(hit_blocks, self.block_tokens)

    @property
    def loads_sliding(self) -> bool:
        """A hybrid model: the sliding layers of a hit's last window come from their own
        namespace (exact mode: always there; bounded mode: when the hit is at a tail)."""
        return bool(self.sliding_layers)

    @property
    def commits_leaving_rows(self) -> bool:
        """Exact mode, hybrid model: every block's sliding rows go to the store, those of a
        block leaving a request's window as they leave (bounded mode sends tails only)."""
        return self.loads_sliding and not self.policy.keeps_window_tails

    def tail(self, end_blocks: int) -> range | None:
        """Bounded mode: the blocks of the window tail of a sequence committed up to
        ``end_blocks`` (those the next token's sliding layers see); None in exact mode."""
        if not self.policy.keeps_window_tails:
            return None
        return range(self.window_first_block(end_blocks), end_blocks)

    def kept_window_from(self, computed_tokens: int) -> int:
        """The position whose window a hybrid pool keeps a request's sliding rows for: the
        next token's, and in bounded mode that of the last block boundary, the end a commit
        of the blocks computed so far sends the window tail of (one block more at most)."""
        if not self.policy.keeps_window_tails:
            return computed_tokens
        return computed_tokens // self.block_tokens * self.block_tokens

    def rewritten_blocks(self, plan: ReplayPlan | None, computed_tokens: int) -> range:
        """Hit blocks whose sliding rows a replay wrote whole (from the first block at or
        after its ``kv_start`` to what is computed): a window tail may include them."""
        if plan is None or not plan.is_replay:
            return range(0)
        first = -(-plan.sliding_kv_start_tokens // self.block_tokens)
        return range(first, min(plan.hit_blocks, computed_tokens // self.block_tokens))

    def needs_sliding_load(self, hit: Sequence[KVBlock]) -> bool:
        """A pool hit whose last window lacks the sliding layers, which the store may have
        (exact mode needs them to use the hit whole; bounded mode to skip the replay)."""
        flags = [self.has_sliding(b) for b in hit]
        return self.loads_sliding and not window_is_cached(
            self.policy, len(hit), self.block_tokens, flags)

    def reserve_blocks(self, pool_hit_blocks: int) -> int:
        """Fresh blocks an admission keeps aside for private copies of the pool's hit blocks
        that its replay may write into (at most ``ceil(keep / B)``)."""
        if not self.policy.is_bounded:
            return 0
        return min(pool_hit_blocks, self.policy.max_replay_blocks(self.block_tokens))

    @property
    def max_reserve_blocks(self) -> int:
        return self.reserve_blocks(1 << 62)

    def plan(self, prompt_tokens: int, has_sliding: Sequence[bool]) -> ReplayPlan:
        """The plan for a hit of ``len(has_sliding)`` blocks (flag ``i``: hit block ``i``
        holds the sliding layers); exact mode may shorten the hit."""
        h = len(has_sliding)
        if not self.policy.is_bounded:
            h = longest_exact_hit(self.policy, h, self.block_tokens, has_sliding)
        cached = window_is_cached(self.policy, h, self.block_tokens, has_sliding)
        return plan_replay(self.policy, prompt_tokens, h, self.block_tokens,
                           window_cached=cached)
