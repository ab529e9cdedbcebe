"""``nn.Linear`` whose matmul runs through ``kernels.linear``: the weight prepared once for
the device's fastest GEMM (for bf16 on a CPU: packed for ``bf16gemv``, else oneDNN's blocked
layout), re-prepared only when it changes. Parameter names and ``state_dict`` are
``nn.Linear``'s, so the loader and checkpoints see no difference.

``bound()`` hands an eager model step (``engine.model.eager_step``) the prepared form
itself (``BoundLinear``: the kernel's ``apply``, its prepared weight, the bias), so a
decode step's hundred-odd products skip the per-call checks of ``forward`` (module
attribute lookups, the weight's version key, the compile and plain-linear switches): the
step checks ``BoundLinear.fresh`` for every weight once instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kernels import gemv
from kernels.linear import PreparedWeight


def weight_version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor has no version counter: it cannot change
        return -1


@dataclass(frozen=True, slots=True)
class BoundLinear:
    """One ``Linear``'s product as prepared now: ``apply(x, value, bias)`` is
    ``F.linear(x, weight, bias)`` (``kernels.linear.LinearKernel``'s contract) while
    ``fresh(module)`` holds (the same weight and bias objects, data and version)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    data_ptr: int
    version: int
    apply: Callable[[torch.Tensor, object, torch.Tensor | None], torch.Tensor]
    value: object

    def fresh(self, module: Linear) -> bool:
        params = module._parameters
        w = self.weight
        return (params["weight"] is w and params["bias"] is self.bias
                and w.data_ptr() == self.data_ptr and weight_version(w) == self.version)


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kw: object
                 ) -> None:
        super().__init__(in_features, out_features, bias, **kw)  # type: ignore[arg-type]
        self.prepared = PreparedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = self._parameters  # not nn.Module.__getattr__: this runs per product
        return self.prepared.linear(x, params["weight"], params["bias"])  # type: ignore[arg-type]

    def bound(self) -> BoundLinear | None:
        """The prepared product for eager steps, or None where ``forward`` must run (a
        weight no kernel prepares: 1-D, or a dtype the model does not compute in)."""
        w, b = self._parameters["weight"], self._parameters["bias"]
        if w is None or w.dim() != 2:
            return None
        # One product through the public path prepares the weight (or finds it prepared)
        # exactly as ``forward`` would; its prepared form is then read back.
        self.prepared.linear(w.new_zeros((1, w.shape[1])), w, b)
        prepared = self.prepared.prepared_for(w)
        if prepared is None:
            return None
        kernel, value = prepared
        apply = kernel.apply
        if isinstance(value, gemv.PackedWeight) and (b is None or b.dtype == torch.bfloat16):
            # bf16gemv's apply only converts the bias and forwards: call what it calls.
            apply = gemv.linear  # type: ignore[assignment]
        return BoundLinear(w, b, w.data_ptr(), weight_version(w), apply, value)
