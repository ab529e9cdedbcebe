"""The model contract the engine's runner relies on."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.spec import ModelSpec


class CausalLM(nn.Module, ABC):
    """A decoder-only model whose attention reads and writes the paged KV cache.

    ``forward`` runs one engine step: it writes the K/V of every token of ``batch`` into
    ``kv`` at ``batch.slot_mapping`` (every layer), attends through the block tables, and
    returns float32 next-token logits ``[len(batch.logits_indices), vocab_size]`` for the
    rows named by ``batch.logits_indices``. It never keeps state between calls: everything
    a sequence has computed lives in ``kv``.
    """

    spec: ModelSpec

    @abstractmethod
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor: ...
