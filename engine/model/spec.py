"""What the rest of the engine needs to know about a loaded model (the model package
derives it from ``config.json``; the runner, the pool and the store namespace read it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ModelSpec:
    # The store namespace's model_id: the architecture, so two copies of one checkpoint in
    # different directories share cached KV (the revision tells checkpoints apart).
    model_id: str
    name: str  # what clients call it: the fetched name, config's _name_or_path, the dir
    architecture: str  # config.json "architectures"[0]
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context_tokens: int  # max_position_embeddings
    dtype: torch.dtype  # weights and KV
    # Per layer: the sliding window in tokens (transformers' convention: key j visible to
    # query i iff i − j < window), or None for full attention.
    layer_windows: tuple[int | None, ...]
    eos_token_ids: tuple[int, ...]
    # Digest of the tensor bytes and of the config fields that change KV (DESIGN §11).
    revision: str

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w is None)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w is not None)
