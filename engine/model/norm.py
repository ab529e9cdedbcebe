"""RMSNorm as transformers computes it, in the two styles of the supported families.

Both normalise in float32. Llama's casts back to the activations' dtype and then scales by
``weight``; Gemma's scales by ``1 + weight`` while still in float32 and casts at the end
(its weights are stored as offsets from 1). The order of cast and scale matters in bf16.
The formula lives in ``kernels.fused.torch_rms_norm``, beside its fused C form.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.registry import NormStyle
from kernels.fused import torch_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, style: NormStyle = NormStyle.SCALE) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.one_plus = style is NormStyle.ONE_PLUS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The torch form (kernels.fused); a model step calls the fused ops with this
        # module's weight instead (DecoderLM.dense_step).
        return torch_rms_norm(x, self.weight, self.eps, self.one_plus)

    def extra_repr(self) -> str:
        style = ", 1 + weight" if self.one_plus else ""
        return f"{tuple(self.weight.shape)}, eps={self.eps}{style}"
