"""One layer's attention as one opaque op, so a compiled model step keeps it out of its graph.

The dense parts of a layer (norms, projections, RoPE, the MLP, the residual adds) are
functions of a step's tokens alone; attention is not: it writes the step's K/V into the
pool and reads every key through block tables whose shapes change every step. A compiler
that traced it would specialise on the metadata (a recompile per batch mix) or break its
graph at every layer. So a step runs its layers inside a ``StepContext`` (the batch, the KV
cache, each layer's attention module), and each layer calls ``attend(q, k, v, layer)``:

- eager, a plain Python call into the layer's ``Attention.attend``;
- while ``torch.compile`` traces, the custom op ``kvengine::paged_attention``, which the
  graph holds as one opaque call with the shape of ``q``. Any attention backend (torch,
  invariant, a C kernel) runs behind it unchanged, and the graph never sees the metadata.

The op writes the pool, which is not among its arguments: nothing else in a graph reads or
writes the pool, so no ordering the compiler could change depends on that write. The
compiler sees a pure op, though, and drops it when nothing reads its result: a graph must
always return rows that depend on every layer (``CompiledModel`` never compiles a step
without logits rows; a step with none asks for one and drops it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache


class LayerAttention(Protocol):
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write: ForwardBatch,
               batch: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor
               ) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step's attention calls read besides their tokens."""

    batch: ForwardBatch
    kv: KVCache
    layers: Sequence[LayerAttention]  # layer i's attention module


_local = threading.local()


@contextmanager
def step_context(ctx: StepContext) -> Iterator[None]:
    """Make ``ctx`` the current step of this thread for the duration of the block."""
    before = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield
    finally:
        _local.ctx = before


def current_step() -> StepContext:
    ctx: StepContext | None = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("attention called outside a model step (no StepContext)")
    return ctx


def _attend_now(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    ctx = current_step()
    b = ctx.batch
    return ctx.layers[layer].attend(q, k, v, b.write_batch(layer), b.read_batch(layer),
                                    ctx.kv.k[layer], ctx.kv.v[layer])


@torch.library.custom_op("kvengine::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
                    ) -> torch.Tensor:
    """Layer ``layer``'s KV-slot write and paged attention for the current step: ``q``
    ``[tokens, heads, head_dim]``, ``k``/``v`` ``[tokens', kv_heads, head_dim]`` (more rows
    than ``q`` in the layer a ``RowCut`` stops at); returns ``[tokens, heads, head_dim]``."""
    out = _attend_now(q, k, v, layer).contiguous()  # the strides the fake promises
    # A custom op's output may not alias an input; a backend may hand back a view.
    return out.clone() if out.data_ptr() in (q.data_ptr(), k.data_ptr(), v.data_ptr()) else out


@paged_attention.register_fake
def _paged_attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
                          ) -> torch.Tensor:
    return q.new_empty(q.shape)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s attention for the current step (``StepContext``)."""
    if torch.compiler.is_compiling():
        return paged_attention(q, k, v, layer)
    return _attend_now(q, k, v, layer)
