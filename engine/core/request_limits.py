"""What one request may be, and when it stops: the scheduler's limits, in one place.

A request is refused up front (bad input, exit 2) only when it could never run: an empty
prompt, a prompt past the context (``--max-model-len``, else the model's), or a prompt
that the whole pool could not hold. Its answer is never reserved: ``max_tokens`` (a
server's default is the rest of the context) is a limit, not a reservation, so a request
is admitted on what its prompt needs and takes blocks as it decodes (the scheduler grows
its table and preempts others when the pool runs out). It stops at an end-of-sequence
token (``stop``), at ``max_tokens``, at the end of the context, or where the pool ends
(``length``).
"""

from __future__ import annotations

from engine.core.sequence import Sequence
from engine.errors import ContextTooLong, EngineInputError, PoolTooSmall
from engine.kv.kv_manager import KVManager


class RequestLimits:
    def __init__(self, kv: KVManager, max_context_tokens: int,
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        self.kv = kv
        self.max_context_tokens = max_context_tokens
        self.eos_token_ids = frozenset(eos_token_ids)

    @property
    def max_seq_blocks(self) -> int:
        """Blocks one sequence may fill: the whole pool, less the room an admission sets
        aside for a replay's private copies (so a preempted sequence is admitted again)."""
        return self.kv.num_blocks - self.kv.max_reserve_blocks

    def check(self, seq: Sequence) -> None:
        """Refuse a request that could never run (``EngineInputError``, exit 2)."""
        n = seq.num_tokens
        if n == 0:
            raise EngineInputError("empty prompt: nothing to generate from")
        if n > self.max_context_tokens:
            raise ContextTooLong(
                f"prompt of {n} tokens exceeds the model's context of "
                f"{self.max_context_tokens} tokens"
            )
        # Reserving max_tokens up front refused every request without one (the rest of
        # the context) on a pool smaller than the context: only the prompt must fit.
        if self.kv.blocks_for(n) > self.max_seq_blocks:
            bt = self.kv.block_tokens
            raise PoolTooSmall(
                f"a prompt of {n} tokens needs a pool of "
                f"{(self.kv.blocks_for(n) + self.kv.max_reserve_blocks) * bt} "
                f"tokens; it holds {self.kv.num_blocks * bt} (--pool-tokens)"
            )

    def stop_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` stops after the token it just sampled (None: it goes on)."""
        last = seq.token_ids[-1]
        if not seq.params.ignore_eos and last in self.eos_token_ids:
            return "stop"
        if last in seq.params.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_new_tokens:
            return "length"
        if seq.num_tokens >= self.max_context_tokens:
            return "length"
        if self.kv.blocks_for(seq.num_tokens) > self.max_seq_blocks:
            # Its next step would need more blocks than the pool gives one sequence: it can
            # never grow, alone or after preempting every other. It stops here, as at the
            # end of the context ("length": the answer so far is whole and the client can
            # continue it), rather than wait forever for blocks that cannot come or fail a
            # request that was admitted. A shortage that other holders cause (loads,
            # other sequences) passes: the scheduler waits or preempts instead.
            return "length"
        return None
