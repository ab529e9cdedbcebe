"""``nn.Linear`` whose matmul runs through ``kernels.linear``: the weight prepared once for
the device's fastest GEMM (for bf16 on a CPU: packed for ``bf16gemv``, else oneDNN's blocked
layout), re-prepared only when it changes. Parameter names and ``state_dict`` are
``nn.Linear``'s, so the loader and checkpoints see no difference."""

from __future__ import annotations

import torch
from torch import nn

from kernels.linear import PreparedWeight


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kw: object
                 ) -> None:
        super().__init__(in_features, out_features, bias, **kw)  # type: ignore[arg-type]
        self.prepared = PreparedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prepared.linear(x, self.weight, self.bias)
