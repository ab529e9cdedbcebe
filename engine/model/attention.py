"""Self-attention over the paged KV cache.

One matmul makes q, k and v (``qkv_proj`` holds q's rows, then k's, then v's); Qwen3 and
Gemma 3 then normalise each head of q and k; RoPE rotates both. The scale is
``head_dim ** -0.5``, or Gemma 3's ``query_pre_attn_scalar ** -0.5``. The step's K/V go into
the pool at ``slot_mapping`` first, so the kernels read every key of a sequence, this
chunk's included, from where it lies (``kernels.paged_prefill_attention`` for the prefill rows,
``kernels.paged_decode_attention`` for the decode rows that follow them). The step's
metadata was validated once (``ForwardBatch.validate``), so each call passes
``validated=True``. The write and the kernels (``attend``) run behind
``engine.model.attention_op.attend``, one opaque call a compiled step keeps out of its graph.
Eager, the q/k norms, RoPE and the K/V write are one fused call (``kernels.fused``'s
``rope_write``) and the kernels run on the pool directly (``attend_written``).

With ``rows`` (a bounded replay's ``RowCut`` at this layer) every row's K/V is written and
only ``rows``' queries attend: the other rows are replayed tokens whose output nothing reads.
"""

from __future__ import annotations

import torch
from torch import nn

import kernels
from engine.core.forward_batch import ForwardBatch
from engine.model import attention_op
from engine.model.config import ModelConfig
from engine.model.linear import Linear
from engine.model.norm import RMSNorm
from engine.model.registry import NormStyle
from engine.model.rope import apply_rotary
from kernels import AttentionBackend
from kernels.fused import TORCH_OPS, FusedOps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = float(cfg.attention_scale)
        # transformers' sliding_window: key j is visible to query i iff i - j < window.
        self.window = cfg.layer_windows[layer]
        self.layer = layer
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_style)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_style)
        self.norm_eps = cfg.rms_norm_eps
        self.norm_one_plus = cfg.norm_style is NormStyle.ONE_PLUS

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ops: FusedOps = TORCH_OPS, rows: torch.Tensor | None = None) -> torch.Tensor:
        qkv = self.qkv_proj.forward(x)
        if torch.compiler.is_compiling():
            out = self._traced(qkv, cos, sin, rows)
        else:
            # Eager: q/k norms, RoPE and the K/V write in one fused call straight into the
            # pool, then the kernels on the pool (no opaque op needed outside a graph).
            ctx = attention_op.current_step()
            layer = self.layer
            write, batch = ctx.batch.write_batch(layer), ctx.batch.read_batch(layer)
            k_pool, v_pool = ctx.kv.k[layer], ctx.kv.v[layer]
            q_norm, k_norm = self.q_norm, self.k_norm
            q = ops.rope_write(
                qkv, self.num_heads, self.num_kv_heads, self.head_dim, cos, sin,
                None if q_norm is None else q_norm.weight,
                None if k_norm is None else k_norm.weight, self.norm_eps, self.norm_one_plus,
                k_pool, v_pool, self.slots(write), batch.backend)
            if rows is not None:
                # Row-wise ops above, so the kept rows' q are the bits they would be uncut.
                q = q.index_select(0, rows)
            out = self.attend_written(q, batch, k_pool, v_pool)
        return self.o_proj.forward(out.reshape(out.shape[0], self.q_size))

    def _traced(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                rows: torch.Tensor | None) -> torch.Tensor:
        """The torch forms, for a graph ``torch.compile`` traces (inductor fuses them); the
        K/V write and attention are the opaque ``attention_op.attend``."""
        tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(tokens, self.num_kv_heads, self.head_dim))
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        else:
            # q's heads and k's are adjacent columns: one rotation covers both (the same
            # elementwise ops on the same values, so the same bits as two).
            heads = self.num_heads + self.num_kv_heads
            qk = apply_rotary(qkv[:, : self.q_size + self.kv_size].view(
                tokens, heads, self.head_dim), cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        if rows is not None:
            # Row-wise ops above, so the kept rows' q are the bits they would be uncut.
            q = q.index_select(0, rows)
        return attention_op.attend(q, k, v, self.layer)

    def slots(self, batch: ForwardBatch) -> torch.Tensor:
        """The flat pool slots this layer writes the step's K/V at."""
        group = batch.kv_group(self.layer)  # a hybrid pool's sliding groups have own pages
        slots = batch.slot_mapping if group == 0 else batch.group_slot_mappings[group - 1]
        if self.window is None and batch.full_slot_mapping is not None:
            slots = batch.full_slot_mapping  # a replay keeps the cached full-layer KV
        return slots

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write: ForwardBatch,
               batch: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor
               ) -> torch.Tensor:
        """Write ``k``/``v`` at ``write``'s slots, then attend ``q`` (``batch``'s rows):
        ``[tokens, heads, head_dim]``. ``write`` and ``batch`` differ only in the layer a
        ``RowCut`` stops at (``ForwardBatch.write_batch`` / ``read_batch``)."""
        kernels.write_kv_slots(k, v, k_pool, v_pool, self.slots(write), backend=batch.backend,
                               validated=True)
        return self.attend_written(q, batch, k_pool, v_pool)

    def attend_written(self, q: torch.Tensor, batch: ForwardBatch, k_pool: torch.Tensor,
                       v_pool: torch.Tensor, direct: AttentionBackend | None = None
                       ) -> torch.Tensor:
        """Attention over the pools, the step's K/V already in them. ``direct``: the step's
        backend, resolved, its metadata validated and no per-call checks wanted
        (``engine.model.eager_step``): its methods are called as they are."""
        if batch.num_tokens == 0:
            return q  # every row of the step stopped below this layer: no query
        backend = batch.backend
        group = batch.kv_group(self.layer)
        parts = []
        n_pre = batch.num_prefill_tokens
        window = self.window
        if batch.prefill is not None:
            pre = batch.prefill
            pre_args = (q[:n_pre], k_pool, v_pool, pre.cu_seqlens_q,
                        pre.block_tables if group == 0 else pre.group_tables[group - 1],
                        pre.seq_lens, self.scale, window,
                        pre.sliding_kv_start if window is not None else None)
            parts.append(kernels.paged_prefill_attention(*pre_args, backend=backend,
                                                         validated=True)
                         if direct is None else direct.paged_prefill_attention(*pre_args))
        if batch.decode is not None:
            dec = batch.decode
            dec_args = (q[n_pre:] if n_pre else q, k_pool, v_pool,
                        dec.block_tables if group == 0 else dec.group_tables[group - 1],
                        dec.seq_lens, self.scale, window,
                        dec.sliding_kv_start if window is not None else None)
            parts.append(kernels.paged_decode_attention(*dec_args, backend=backend,
                                                        validated=True)
                         if direct is None else direct.paged_decode_attention(*dec_args))
        if not parts:
            raise ValueError("a ForwardBatch needs prefill or decode metadata")
        return parts[0] if len(parts) == 1 else torch.cat(parts)
