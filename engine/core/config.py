"""The engine's knobs, in one frozen object (units in the names)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bounded_replay import ReplayPolicy, resolve_policy
from engine.errors import EngineInputError
from engine.kv.kv_groups import KVGroupLayout


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pool_tokens: int = 65536  # KV pool (the hbm tier) size, rounded down to whole blocks
    block_tokens: int = 64  # pool block = store block (DESIGN §3)
    max_batched_tokens: int = 2048  # per-step token budget: decodes, then prefill chunks
    max_num_seqs: int = 64  # sequences admitted (running or loading) at once
    load_timeout_s: float = 10.0  # a store load not done by then is abandoned: recompute
    store_call_timeout_s: float = 5.0  # deadline of one lookup / get_into
    commit_timeout_s: float = 30.0  # deadline of one commit (back-pressure included)
    close_timeout_s: float = 120.0  # how long close() waits for pending commits
    # Host memory for commits on their way to the store (finished requests' blocks are
    # copied out of the pool into it at once); when it is full a commit is cut short.
    commit_staging_bytes: int = 1 << 30
    attention_backend: str | None = None  # kernels backend name; None: the device's default
    # Bounded replay (DESIGN §11, opt-in): tokens of a hit replayed; None (the default) and
    # 0: exact mode (bounded_replay/README.md: the rule's measurement made exact the default).
    replay_keep_tokens: int | None = None
    replay_force: bool = False  # accept a keep below the safe default
    # A replayed token stops at the last sliding layer (engine.core.row_cut): nothing above
    # it reads its hidden state. False runs it through every layer, for the A/B of
    # bench/bench_replay.py (--ab-cut) only: the new tokens' logits are the same.
    replay_row_cut: bool = True
    cache_all_layers: bool = False  # exact mode: the store keeps every layer
    # False: only the prompt's full blocks are indexed in the pool and committed, so a trace
    # replay leaves in the caches exactly the blocks the trace names (kvengine bench-serve).
    cache_generated_tokens: bool = True
    # The context the engine serves (prompt and answer), below the model's own
    # (max_position_embeddings); None: the model's.
    max_model_len: int | None = None
    # Batch-invariant numerics (engine.core.numerics): a request's logits bitwise the same
    # whatever shares its steps, however it was chunked, wherever its prefix came from.
    deterministic: bool = False
    # torch.compile (inductor, CPU C++) of the model's dense step (engine.model.compiled):
    # the first step of each size class builds a graph (tens of seconds), later ones skip
    # Python dispatch. Off under deterministic mode.
    compile_step: bool = False
    # A hybrid model's sliding layers keep only the blocks they can still see, in pages of
    # the same byte budget (engine.kv.kv_groups); False: every layer keeps every block.
    hybrid_pool: bool = True

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise EngineInputError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.pool_tokens < self.block_tokens:
            raise EngineInputError(
                f"the pool of {self.pool_tokens} tokens holds no {self.block_tokens}-token block"
            )
        if self.max_batched_tokens < 1 or self.max_num_seqs < 1:
            raise EngineInputError("max_batched_tokens and max_num_seqs must be >= 1")
        if self.commit_staging_bytes < 0:
            raise EngineInputError("commit_staging_bytes must be >= 0")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise EngineInputError(f"max_model_len must be >= 1, got {self.max_model_len}")
        for name in ("load_timeout_s", "store_call_timeout_s", "commit_timeout_s"):
            if getattr(self, name) <= 0:
                raise EngineInputError(f"{name} must be positive")

    def replay_policy(self, layer_windows: Sequence[int | None]) -> ReplayPolicy:
        """The replay policy for a model with these windows (refusals raise, exit 2)."""
        return resolve_policy(layer_windows, self.replay_keep_tokens, force=self.replay_force,
                              cache_all_layers=self.cache_all_layers)

    def context_tokens(self, model_context_tokens: int) -> int:
        """The context served for a model whose own is ``model_context_tokens``; a
        ``max_model_len`` above it is refused (exit 2)."""
        if self.max_model_len is None:
            return model_context_tokens
        if self.max_model_len > model_context_tokens:
            raise EngineInputError(
                f"--max-model-len/max_model_len {self.max_model_len} exceeds the model's "
                f"context of {model_context_tokens} tokens (max_position_embeddings)")
        return self.max_model_len

    @property
    def num_blocks(self) -> int:
        return self.pool_tokens // self.block_tokens

    def kv_layout(self, layer_windows: Sequence[int | None]) -> KVGroupLayout:
        """The pool's KV groups for a model with these windows."""
        if not self.hybrid_pool:
            return KVGroupLayout.single(len(layer_windows))
        return KVGroupLayout.for_windows(layer_windows)

    def num_pages(self, layout: KVGroupLayout) -> int:
        """Pages of the pool: the bytes of ``num_blocks`` whole blocks (every layer), in
        pages of ``layout.unit_layers`` layers."""
        return self.num_blocks * layout.num_layers // layout.unit_layers
