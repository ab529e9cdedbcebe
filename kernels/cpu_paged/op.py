"""``kvengine::cpu_paged_decode``: the kernel as an opaque torch custom op.

A ``torch.compile``d layer cannot trace into a C extension called on data pointers, so
``paged_decode`` is registered as a custom op with a fake (meta) implementation that only
states the output's shape and dtype: the compiler then keeps the call as one opaque node and
compiles the dense parts around it. Registration is lazy (``decode_op()``), once per process,
so importing the backend costs nothing when no one compiles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from kernels.cpu_paged import decode

OP_NAME = "kvengine::cpu_paged_decode"
_lock = threading.Lock()
_op: list[Callable[..., torch.Tensor]] = []


def decode_op() -> Callable[..., torch.Tensor]:
    """The registered op, ``(q, k_pool, v_pool, block_tables, seq_lens, scale, window,
    kv_start) -> Tensor``, with ``paged_decode_attention``'s arguments and result."""
    with _lock:
        if not _op:
            _op.append(_register())
        return _op[0]


def _register() -> Callable[..., torch.Tensor]:
    @torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cpu")
    def cpu_paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         window: int | None, kv_start: torch.Tensor | None) -> torch.Tensor:
        return decode.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, scale, window,
                                   kv_start)

    @cpu_paged_decode.register_fake
    def _(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
          block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
          window: int | None, kv_start: torch.Tensor | None) -> torch.Tensor:
        return q.new_empty(q.shape)

    return cpu_paged_decode
