"""The decoder-only transformer shared by every supported architecture.

Module names follow transformers' (``model.layers.N.self_attn…``) except where two of its
projections are fused (``qkv_proj``, ``gate_up_proj``), so the loader maps names one to
one. Tied embeddings have no ``lm_head``: the logits reuse the embedding matrix.

Gemma 3's switches (``ModelConfig``): embeddings times ``sqrt(hidden_size)`` (a float32
scalar cast to the embedding's dtype, as transformers does, so bf16 rounds it the same),
``(1 + weight)`` norms, four norms per layer (``sandwich_norms``), one RoPE for sliding
layers and one for full ones, and ``cap * tanh(logits / cap)`` on the logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.attention import Attention
from engine.model.attention_op import StepContext, step_context
from engine.model.base import CausalLM
from engine.model.config import ModelConfig
from engine.model.eager_step import EagerLayers, LayerPlan
from engine.model.linear import Linear
from engine.model.mlp import GatedMLP
from engine.model.norm import RMSNorm
from engine.model.registry import NormStyle
from engine.model.rope import RopeConfig, RotaryEmbedding, inverse_frequencies
from engine.model.spec import ModelSpec
from kernels.fused import TORCH_OPS, FusedOps, fused_ops
from kernels.linear import PreparedWeight

#: ``(input_ids, positions, logits_indices, cut_rows, cut_layer) -> float32 logits``:
#: ``DecoderLM.dense_step``.
DenseStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, int],
                     torch.Tensor]


class DecoderLayer(nn.Module):
    """Llama's two norms (before attention, before the MLP), or with ``sandwich_norms``
    Gemma's four: ``post_attention_layernorm`` then normalises the attention's output
    before the residual add, and ``pre_``/``post_feedforward_layernorm`` wrap the MLP."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        eps, style = cfg.rms_norm_eps, cfg.norm_style
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, style)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, style)
        self.pre_feedforward_layernorm: RMSNorm | None = None
        self.post_feedforward_layernorm: RMSNorm | None = None
        if cfg.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, style)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, style)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.activation)
        self.eps = eps
        self.one_plus = style is NormStyle.ONE_PLUS

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, ops: FusedOps = TORCH_OPS, rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, residual)``: the stream is ``residual + out``, the add left to the next
        norm, which does both in one pass (``ops.add_rms_norm``). ``residual`` None: ``h``
        is the stream itself (the first layer). ``rows``: only these rows go on past the
        attention's KV write (``RowCut``)."""
        eps, one_plus = self.eps, self.one_plus
        in_w = self.input_layernorm.weight
        if residual is None:
            x, residual = ops.rms_norm(h, in_w, eps, one_plus), h
        else:
            x, residual = ops.add_rms_norm(h, residual, in_w, eps, one_plus)
        a = self.self_attn.forward(x, cos, sin, ops, rows)
        if rows is not None:
            residual = residual.index_select(0, rows)
        post_w = self.post_attention_layernorm.weight
        pre_ff, post_ff = self.pre_feedforward_layernorm, self.post_feedforward_layernorm
        if pre_ff is None or post_ff is None:
            x, residual = ops.add_rms_norm(a, residual, post_w, eps, one_plus)
            return self.mlp.forward(x, ops), residual
        x, residual = ops.add_rms_norm(ops.rms_norm(a, post_w, eps, one_plus), residual,
                                       pre_ff.weight, eps, one_plus)
        return ops.rms_norm(self.mlp.forward(x, ops), post_ff.weight, eps, one_plus), residual


class DecoderStack(nn.Module):
    """transformers' ``…Model``: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_style)


class DecoderLM(CausalLM):
    """Llama, Mistral, Qwen2, Qwen3 and Gemma 3 (the config's switches pick the variant)."""

    eager: EagerLayers

    def __init__(self, cfg: ModelConfig, spec: ModelSpec) -> None:
        super().__init__()
        self.cfg = cfg
        self.spec = spec
        self.model = DecoderStack(cfg)
        self.lm_head: Linear | None = None
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Tied logits reuse the embedding matrix: its prepared copy for the logits' matmul.
        self.tied_logits = PreparedWeight()
        # One rotary per distinct RoPE (Gemma 3: sliding and full layers differ); each layer
        # reads its own's cos/sin, computed once per step.
        self.ropes: list[RopeConfig] = list(dict.fromkeys(
            cfg.layer_rope(i) for i in range(cfg.num_layers)))
        self.rotaries = nn.ModuleList(RotaryEmbedding(r, cfg.head_dim) for r in self.ropes)
        self.layer_rotary = [self.ropes.index(cfg.layer_rope(i)) for i in range(cfg.num_layers)]
        # Not a submodule (a plain attribute): the layers' prepared plans for eager steps.
        self.__dict__["eager"] = EagerLayers(self.model.layers, self.layer_rotary)

    def init_buffers(self, device: torch.device) -> None:
        """Recompute the non-persistent buffers (the model is built on the meta device
        and only its parameters are loaded)."""
        for rope, rotary in zip(self.ropes, self.rotaries, strict=True):
            rotary.inv_freq = inverse_frequencies(rope, self.cfg.head_dim).to(device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        return self.run_step(batch, kv, self.dense_step)

    def run_step(self, batch: ForwardBatch, kv: KVCache, dense: DenseStep) -> torch.Tensor:
        """One engine step with ``dense`` computing it (``dense_step`` itself, or a compiled
        form of it): the metadata checked once, the attention calls pointed at ``batch`` and
        ``kv`` (``engine.model.attention_op``). Eager, without a ``RowCut``, the layers run
        on their prepared plans (``engine.model.eager_step``) where the step allows."""
        if len(kv.k) != self.cfg.num_layers:
            raise ValueError(f"the KV cache has {len(kv.k)} layers, the model "
                             f"{self.cfg.num_layers}")
        batch.validate(kv.k[0], kv.v[0])  # once for every layer's kernel calls
        cut = batch.row_cut
        if dense == self.dense_step and cut is None and self.eager.usable():
            plans = self.eager.plans()
            if plans is not None:
                return self._planned_step(plans, batch, kv)
        attention: list[Attention] = [layer.self_attn for layer in self.model.layers]  # type: ignore[misc]
        ctx = StepContext(batch, kv, attention)
        with step_context(ctx):
            if cut is None:
                return dense(batch.input_ids, batch.positions, batch.logits_indices, None, -1)
            return dense(batch.input_ids, batch.positions, cut.tail.logits_indices, cut.rows,
                         cut.layer)

    def _planned_step(self, plans: list[LayerPlan], batch: ForwardBatch, kv: KVCache
                      ) -> torch.Tensor:
        h, cos_sin = self._embed(batch.input_ids, batch.positions)
        ops = self.eager.step_ops(plans, fused_ops(), batch, kv, h.dtype, cos_sin)
        h, residual = EagerLayers.run(plans, h, cos_sin, batch, kv, ops)
        # The final norm's weight is not among those step_ops checked: the checked ops.
        return self._logits(h, residual, batch.logits_indices, fused_ops())

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The step's embeddings and each rotary's ``(cos, sin)``."""
        embed = self.model.embed_tokens
        h = embed(input_ids)
        if self.cfg.embed_scale:
            h = h * torch.tensor(self.cfg.hidden_size**0.5).to(embed.weight.dtype)
        return h, [rotary(positions, h.dtype) for rotary in self.rotaries]

    def dense_step(self, input_ids: torch.Tensor, positions: torch.Tensor,
                   logits_indices: torch.Tensor, cut_rows: torch.Tensor | None = None,
                   cut_layer: int = -1) -> torch.Tensor:
        """The step as a function of its tokens alone (attention reads the rest from the
        ``StepContext``), so ``torch.compile`` can trace it whole. With ``cut_rows`` only
        those rows go on past layer ``cut_layer``'s KV write (``engine.core.row_cut``), and
        ``logits_indices`` number them."""
        h, cos_sin = self._embed(input_ids, positions)
        ops = fused_ops()  # the torch forms while torch.compile traces
        residual: torch.Tensor | None = None
        layer_rotary = self.layer_rotary
        for i, layer in enumerate(self.model.layers):
            cos, sin = cos_sin[layer_rotary[i]]
            if i != cut_layer or cut_rows is None:
                h, residual = layer.forward(h, residual, cos, sin, ops)
                continue
            h, residual = layer.forward(h, residual, cos, sin, ops, cut_rows)
            cos_sin = [(c.index_select(0, cut_rows), s.index_select(0, cut_rows))
                       for c, s in cos_sin]
        return self._logits(h, residual, logits_indices, ops)

    def _logits(self, h: torch.Tensor, residual: torch.Tensor | None,
                logits_indices: torch.Tensor, ops: FusedOps) -> torch.Tensor:
        """The last add, norm and logits, only for the rows the runner asked for."""
        norm = self.model.norm
        rows = h.index_select(0, logits_indices)
        if residual is None:  # no layers
            h = ops.rms_norm(rows, norm.weight, norm.eps, norm.one_plus)
        else:
            h = ops.add_rms_norm(rows, residual.index_select(0, logits_indices), norm.weight,
                                 norm.eps, norm.one_plus)[0]
        if self.lm_head is None:
            logits = self.tied_logits.linear(h, self.model.embed_tokens.weight, None)
        else:
            logits = self.lm_head(h)
        cap = self.cfg.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap  # in the model's dtype, as transformers
        return logits.float()
