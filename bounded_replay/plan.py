"""The replay plan of one admission: what comes from the cache, what is recomputed.

A request of ``L`` prompt tokens hits ``h`` cached blocks of ``B`` tokens (a hit never
covers the last prompt token: ``h·B < L``). With ``s`` the replay start and ``w0`` the
first block the last window reaches (``LayerLayout.window_first_block``)::

    position   0            w0·B       s = h·B − keep      h·B                L
               |-------------|------------|-----------------|------------------|
    full       [ loaded from the cache: blocks [0, h)       ][ computed        ]
    sliding    [ no KV: kv_start = s, never read ][ replayed ][ computed        ]
    model input                           [ replayed tokens ][ new tokens      ]
                                            min(keep, h·B)     L − h·B

    exact mode: the same plan with an empty replay (s = h·B)
    full       [ loaded from the cache: blocks [0, h)       ][ computed        ]
    sliding    [ no KV: kv_start = w0·B ][ loaded: [w0, h)  ][ computed        ]
    model input                                              [ new tokens      ]

The replay runs tokens ``[s, L)`` through every layer. The sliding layers write their KV
from ``s`` on (they had none), the full-attention layers only from ``h·B`` on: below it
they keep the cached KV, which a cold prefill would have computed too, so only the sliding
layers' window (and what later layers compute from it) differs from a cold prefill. With
``keep ≥ h·B`` the replay starts at 0 and the result is a cold prefill's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bounded_replay.errors import PlanInputError
from bounded_replay.policy import ReplayMode, ReplayPolicy


@dataclass(frozen=True, slots=True)
class KVRange:
    """The KV of ``layers`` at token positions ``[start_tokens, end_tokens)``."""

    layers: tuple[int, ...]
    start_tokens: int
    end_tokens: int

    @property
    def num_tokens(self) -> int:
        return max(0, self.end_tokens - self.start_tokens)

    def blocks(self, block_tokens: int) -> range:
        """The blocks the range touches."""
        if self.num_tokens == 0:
            return range(0)
        return range(self.start_tokens // block_tokens, -(-self.end_tokens // block_tokens))


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """One admission's plan (see the module docstring for the picture).

    ``loads``: KV taken from the cache (pool or store), block aligned, within the hit.
    ``writes``: KV this request's prefill computes and writes, per group of layers.
    ``sliding_kv_start_tokens``: the sliding layers hold no KV before it (the kernels'
    ``kv_start``); 0 for a model without sliding layers.
    """

    mode: ReplayMode
    keep_tokens: int
    prompt_tokens: int
    block_tokens: int
    hit_blocks: int
    replay_start_tokens: int
    loads: tuple[KVRange, ...]
    writes: tuple[KVRange, ...]
    sliding_kv_start_tokens: int

    @property
    def hit_tokens(self) -> int:
        return self.hit_blocks * self.block_tokens

    @property
    def replayed_tokens(self) -> int:
        """Tokens of the hit that go through the model again: ``min(keep, h·B)`` on a
        replay, else 0."""
        return self.hit_tokens - self.replay_start_tokens

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens the prefill runs through the model."""
        return self.prompt_tokens - self.replay_start_tokens

    @property
    def is_replay(self) -> bool:
        return self.replayed_tokens > 0

    @property
    def full_write_start_tokens(self) -> int:
        """Below this position the full-attention layers keep the cached KV."""
        return self.hit_tokens

    @property
    def replay_blocks(self) -> range:
        """Hit blocks the replay writes into (sliding layers only): the request must hold
        them alone, as other requests may read the cached block's layers."""
        if not self.is_replay:
            return range(self.hit_blocks, self.hit_blocks)
        return range(self.replay_start_tokens // self.block_tokens, self.hit_blocks)


def _check(prompt_tokens: int, hit_blocks: int, block_tokens: int) -> None:
    if block_tokens < 1 or prompt_tokens < 1:
        raise PlanInputError(f"block_tokens ({block_tokens}) and prompt_tokens "
                             f"({prompt_tokens}) must be >= 1")
    if hit_blocks < 0 or hit_blocks * block_tokens >= prompt_tokens:
        raise PlanInputError(
            f"a hit of {hit_blocks} blocks of {block_tokens} tokens must leave at least the "
            f"last of {prompt_tokens} prompt tokens to compute"
        )


def window_is_cached(policy: ReplayPolicy, hit_blocks: int, block_tokens: int,
                     has_sliding: Sequence[bool]) -> bool:
    """Whether every block of the last window (``[w0, h)``) holds the sliding layers' KV
    (``has_sliding[i]`` for hit block ``i``). Trivially true without separate sliding KV."""
    if not policy.sliding_apart:
        return True
    w0 = policy.layout.window_first_block(hit_blocks, block_tokens)
    return all(has_sliding[i] for i in range(w0, hit_blocks))


def longest_exact_hit(policy: ReplayPolicy, hit_blocks: int, block_tokens: int,
                      has_sliding: Sequence[bool]) -> int:
    """The longest hit ``h' ≤ hit_blocks`` that exact mode can use: every block of its last
    window holds the sliding layers' KV. 0 always qualifies (an empty window)."""
    if len(has_sliding) < hit_blocks:
        raise PlanInputError(f"has_sliding covers {len(has_sliding)} of {hit_blocks} blocks")
    h = hit_blocks
    while h > 0 and not window_is_cached(policy, h, block_tokens, has_sliding):
        h -= 1
    return h


def plan_replay(
    policy: ReplayPolicy,
    prompt_tokens: int,
    hit_blocks: int,
    block_tokens: int,
    *,
    window_cached: bool = False,
) -> ReplayPlan:
    """The plan for a hit of ``hit_blocks`` blocks. ``window_cached``: the cache also holds
    the sliding layers' KV of the last window's blocks (exact mode requires it: shrink the
    hit with ``longest_exact_hit`` first; in bounded mode it makes the replay empty)."""
    _check(prompt_tokens, hit_blocks, block_tokens)
    lay = policy.layout
    hit = hit_blocks * block_tokens
    primary = policy.primary_layers
    loads = [KVRange(primary, 0, hit)] if hit else []
    apart = policy.sliding_apart
    if not apart:  # every layer's KV is in the primary namespace: nothing to replay
        return ReplayPlan(policy.mode, policy.keep_tokens, prompt_tokens, block_tokens,
                          hit_blocks, hit, tuple(loads),
                          (KVRange(lay.all_layers, hit, prompt_tokens),), 0)
    w0 = lay.window_first_block(hit_blocks, block_tokens) * block_tokens
    if hit == 0 or window_cached:
        if hit > w0:
            loads.append(KVRange(apart, w0, hit))
        start = hit
        kv_start = w0
    elif policy.is_bounded:
        start = max(0, hit - policy.keep_tokens)
        kv_start = start
    else:
        raise PlanInputError("exact mode needs the last window's sliding KV in the cache: "
                             "shrink the hit with longest_exact_hit first")
    writes = (KVRange(lay.full_layers, hit, prompt_tokens),
              KVRange(lay.sliding_layers, start, prompt_tokens))
    return ReplayPlan(policy.mode, policy.keep_tokens, prompt_tokens, block_tokens,
                      hit_blocks, start, tuple(loads), writes, kv_start)
