"""The decoder's layers for an eager step, with everything per layer resolved in advance.

A decode step of a small model is a few hundred short calls; at one to eight rows each
product, norm and RoPE call is a few microseconds of work, and the Python around it
(``nn.Module.__getattr__`` for every submodule and parameter, ``PreparedWeight``'s version
key, each fused op's layout checks, the kernel entry points' ``validated`` and
debug-flag checks) cost as much again. ``EagerLayers`` holds one ``LayerPlan`` per layer
(the norm weights, each product's ``BoundLinear``, the attention's constants) and runs the
same ops as ``DecoderLayer.forward`` in the same order on the same arguments, so its
results are the module path's bits (``tests/engine/model/test_eager_step.py``).

What the modules checked per call is checked once per step instead (``usable``): no
``torch.compile`` trace and no ``TorchFunctionMode`` (deterministic mode intercepts
``F.linear``; its steps keep the module path), every prepared weight unchanged since the
plan was built (else it is rebuilt), and the step's metadata validated
(``ForwardBatch.validate``). ``KERNELS_DEBUG_CHECKS=1`` keeps the module path, whose calls
re-check everything. The fused ops are ``kernels.fused.TrustedFusedOps`` when the step's
weights, pools, cos/sin and slots fit them (``kernels.fused.step_fits``), else the ops the
module path would use. A bounded replay's ``RowCut`` keeps the module path too.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.attention import Attention
from engine.model.linear import BoundLinear, Linear, weight_version
from kernels import debug_checks, resolve_backend
from kernels import linear as kernels_linear
from kernels.fused import TRUSTED_OPS, CompiledFusedOps, FusedOps, step_fits


@dataclass(frozen=True, slots=True)
class LayerPlan:
    layer: int
    rotary: int  # index into the step's cos/sin pairs
    attn: Attention  # for its slots and attention calls
    in_w: torch.Tensor
    post_w: torch.Tensor
    pre_ff_w: torch.Tensor | None  # sandwich norms (Gemma 3); None: Llama's two norms
    post_ff_w: torch.Tensor | None
    q_w: torch.Tensor | None  # per-head q/k norms (Qwen3, Gemma 3)
    k_w: torch.Tensor | None
    eps: float
    one_plus: bool
    qkv: BoundLinear
    o: BoundLinear
    gate_up: BoundLinear
    down: BoundLinear
    gelu: bool


def _param_slots(layers: Sequence[torch.nn.Module]
                 ) -> list[tuple[dict[str, Any], str]]:
    """Where each parameter of ``layers`` lives (its module's ``_parameters`` and name), so
    a step reads them back without ``nn.Module.__getattr__``."""
    return [(mod._parameters, name) for layer in layers for mod in layer.modules()
            for name, p in mod._parameters.items() if p is not None]


def _versions(tensors: list[torch.Tensor]) -> list[int]:
    try:
        return [t._version for t in tensors]
    except RuntimeError:  # an inference tensor among them: no version counter
        return [weight_version(t) for t in tensors]


@dataclass(frozen=True, slots=True)
class _Key:
    """What a plan was built from: each parameter object, its data and version."""

    tensors: list[torch.Tensor]
    ptrs: list[int]
    versions: list[int]


class EagerLayers:
    """The layer plans of one ``DecoderStack``, rebuilt when a parameter changes."""

    def __init__(self, layers: Iterable[torch.nn.Module], layer_rotary: Sequence[int]) -> None:
        self._modules = list(layers)
        self._rotary = list(layer_rotary)
        self._plans: list[LayerPlan] | None = None
        self._built: _Key | None = None
        self._slots = _param_slots(self._modules)
        self.rebuilds = 0  # plans built (tests: a weight change rebuilds once)

    def usable(self) -> bool:
        """Whether this step may run on the plans (the reasons are the module docstring's)."""
        return (not torch.compiler.is_compiling()
                and not torch._C._is_torch_function_mode_enabled()
                and not kernels_linear.plain_linears_active()
                and not debug_checks())

    def plans(self) -> list[LayerPlan] | None:
        """The plans, rebuilt when a parameter changed (another object, other data, an
        in-place write); None where a layer has a product without a prepared form (the
        module path then runs)."""
        tensors = [d[n] for d, n in self._slots]
        built = self._built
        if (built is None or len(tensors) != len(built.tensors)
                or not all(map(operator.is_, tensors, built.tensors))
                or [t.data_ptr() for t in tensors] != built.ptrs
                or _versions(tensors) != built.versions):
            self._slots = _param_slots(self._modules)
            self._plans = self._build()
            tensors = [d[n] for d, n in self._slots]
            self._built = _Key(tensors, [t.data_ptr() for t in tensors], _versions(tensors))
            self.rebuilds += 1
        return self._plans

    def _build(self) -> list[LayerPlan] | None:
        plans = []
        for i, module in enumerate(self._modules):
            layer: Any = module  # a DecoderLayer (engine.model.decoder imports this module)
            attn, mlp = layer.self_attn, layer.mlp
            linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
            bound = [lin.bound() for lin in linears if isinstance(lin, Linear)]
            qkv, o, gate_up, down = (bound + [None] * 4)[:4]
            if qkv is None or o is None or gate_up is None or down is None:
                return None
            pre, post = layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm
            plans.append(LayerPlan(
                i, self._rotary[i], attn, layer.input_layernorm.weight,
                layer.post_attention_layernorm.weight,
                None if pre is None else pre.weight, None if post is None else post.weight,
                None if attn.q_norm is None else attn.q_norm.weight,
                None if attn.k_norm is None else attn.k_norm.weight,
                layer.eps, layer.one_plus, qkv, o, gate_up, down, mlp.gelu))
        return plans

    def step_ops(self, plans: list[LayerPlan], ops: FusedOps, batch: ForwardBatch,
                 kv: KVCache, dtype: torch.dtype,
                 cos_sin: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> FusedOps:
        """``TrustedFusedOps`` when ``ops`` are the C ops and the step fits them, else
        ``ops`` (which check each call)."""
        # Exactly the C ops: a subclass (an instrumented one, say) keeps its own methods.
        if TRUSTED_OPS is None or type(ops) is not CompiledFusedOps or not plans:
            return ops
        attn = plans[0].attn
        weights = [w for p in plans for w in (p.in_w, p.post_w, p.pre_ff_w, p.post_ff_w,
                                               p.q_w, p.k_w) if w is not None]
        slots = [batch.slot_mapping, *batch.group_slot_mappings]
        if batch.full_slot_mapping is not None:
            slots.append(batch.full_slot_mapping)
        tables = [t for pair in cos_sin for t in pair]
        if step_fits(dtype, attn.head_dim, attn.num_kv_heads, weights, [*kv.k, *kv.v],
                     tables, slots):
            return TRUSTED_OPS
        return ops

    @staticmethod
    def run(plans: list[LayerPlan], h: torch.Tensor,
            cos_sin: Sequence[tuple[torch.Tensor, torch.Tensor]], batch: ForwardBatch,
            kv: KVCache, ops: FusedOps) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer on ``h`` (the embeddings): ``(out, residual)`` as the module path's
        loop leaves them (the stream is their sum)."""
        residual: torch.Tensor | None = None
        k_pools, v_pools = kv.k, kv.v
        # The residual stream is this loop's own: each add may overwrite it in place.
        rms_norm, add_rms_norm, rope_write = ops.rms_norm, ops.add_rms_norm_, ops.rope_write
        gated_act = ops.gated_act
        backend = resolve_backend(batch.backend, h.device)
        for p in plans:
            cos, sin = cos_sin[p.rotary]
            eps, one_plus = p.eps, p.one_plus
            if residual is None:
                x, residual = rms_norm(h, p.in_w, eps, one_plus), h
            else:
                x, residual = add_rms_norm(h, residual, p.in_w, eps, one_plus)
            attn, lin = p.attn, p.qkv
            qkv = lin.apply(x, lin.value, lin.bias)
            i = p.layer
            k_pool, v_pool = k_pools[i], v_pools[i]
            q = rope_write(qkv, attn.num_heads, attn.num_kv_heads, attn.head_dim, cos, sin,
                           p.q_w, p.k_w, attn.norm_eps, attn.norm_one_plus, k_pool, v_pool,
                           attn.slots(batch), backend)
            a = attn.attend_written(q, batch, k_pool, v_pool, backend)
            lin = p.o
            a = lin.apply(a.reshape(a.shape[0], attn.q_size), lin.value, lin.bias)
            if p.pre_ff_w is None or p.post_ff_w is None:
                x, residual = add_rms_norm(a, residual, p.post_w, eps, one_plus)
            else:
                x, residual = add_rms_norm(rms_norm(a, p.post_w, eps, one_plus), residual,
                                           p.pre_ff_w, eps, one_plus)
            lin = p.gate_up
            g = gated_act(lin.apply(x, lin.value, lin.bias), p.gelu)
            lin = p.down
            h = lin.apply(g, lin.value, lin.bias)
            if p.post_ff_w is not None:
                h = rms_norm(h, p.post_ff_w, eps, one_plus)
        return h, residual
