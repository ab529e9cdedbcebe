"""The decoder-only transformer shared by every supported architecture.

Module names follow transformers' (``model.layers.N.self_attn…``) except where two of its
projections are fused (``qkv_proj``, ``gate_up_proj``), so the loader maps names one to
one. Tied embeddings have no ``lm_head``: the logits reuse the embedding matrix.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from engine.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.attention import Attention
from engine.model.base import CausalLM
from engine.model.config import ModelConfig
from engine.model.mlp import GatedMLP
from engine.model.norm import RMSNorm
from engine.model.rope import RotaryEmbedding, inverse_frequencies
from engine.model.spec import ModelSpec


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, batch, k_pool, v_pool)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderStack(nn.Module):
    """transformers' ``…Model``: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(CausalLM):
    """Llama, Mistral, Qwen2 and Qwen3 (the config's switches pick the variant)."""

    def __init__(self, cfg: ModelConfig, spec: ModelSpec) -> None:
        super().__init__()
        self.cfg = cfg
        self.spec = spec
        self.model = DecoderStack(cfg)
        self.lm_head: nn.Linear | None = None
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)

    def init_buffers(self, device: torch.device) -> None:
        """Recompute the non-persistent buffers (the model is built on the meta device
        and only its parameters are loaded)."""
        self.rotary.inv_freq = inverse_frequencies(self.cfg.rope, self.cfg.head_dim).to(device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        if len(kv.k) != self.cfg.num_layers:
            raise ValueError(f"the KV cache has {len(kv.k)} layers, the model "
                             f"{self.cfg.num_layers}")
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary(batch.positions, h.dtype)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, batch, kv.k[i], kv.v[i])
        # Norm and logits only for the rows the runner asked for.
        h = self.model.norm(h.index_select(0, batch.logits_indices))
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()
