"""The engine's knobs, in one frozen object (units in the names)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import EngineInputError


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
    attention_backend: str | None = None  # kernels backend name; None: the device's default

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise EngineInputError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.pool_tokens < self.block_tokens:
            raise EngineInputError(
                f"the pool of {self.pool_tokens} tokens holds no {self.block_tokens}-token block"
            )
        if self.max_batched_tokens < 1 or self.max_num_seqs < 1:
            raise EngineInputError("max_batched_tokens and max_num_seqs must be >= 1")
        for name in ("load_timeout_s", "store_call_timeout_s", "commit_timeout_s"):
            if getattr(self, name) <= 0:
                raise EngineInputError(f"{name} must be positive")

    @property
    def num_blocks(self) -> int:
        return self.pool_tokens // self.block_tokens
