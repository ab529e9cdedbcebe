"""The gated feed-forward block, with gate and up projections fused into one matmul."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.linear import Linear
from kernels.fused import TORCH_OPS, FusedOps


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; ``gate_up_proj`` holds gate's rows then up's.

    ``act``: ``silu`` (SwiGLU: Llama, Mistral, Qwen) or ``gelu_pytorch_tanh`` (GeGLU: Gemma),
    computed as transformers' ``ACT2FN`` does."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool,
                 act: str = "silu") -> None:
        super().__init__()
        if act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"unknown activation {act!r}")
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.gelu = act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor, ops: FusedOps = TORCH_OPS) -> torch.Tensor:
        # Submodules' forwards called directly: nn.Module.__call__ costs more than the
        # activation itself at decode's one row.
        act = ops.gated_act(self.gate_up_proj.forward(x), self.gelu)
        return self.down_proj.forward(act)
