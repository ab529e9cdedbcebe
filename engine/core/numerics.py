"""Deterministic mode (``--deterministic``): a request's logits bitwise independent of its
batch, of its prefill's chunking and of where its prefix's KV came from.

Three things decide a token's numbers beyond its own data, and each is made fixed:

- **matrix products** (every projection, the logits): a CPU BLAS picks its path by the
  number of rows, so the model's ``F.linear`` calls go through
  ``kernels.invariant.matmul.invariant_linear`` (rows zero-padded to a multiple of 16);
- **attention**: the ``invariant`` backend (``kernels.invariant``) walks keys in fixed
  128-token blocks from position 0 with an online softmax;
- the rest is already per row: RMSNorm, RoPE, activations and the residual adds are
  row-wise (their reductions run along one row of fixed length), and the sampler draws
  from each request's own generator (``engine.core.sampler``).

The linears are switched by a ``TorchFunctionMode`` entered around the model's forward
(``BatchInvariantModel``), not by editing the model or patching ATen: the mode is
thread-local and lasts one call, so a model object shared with a normal engine (tests,
the fidelity tools) is untouched, and the model code keeps one path. The cost is a Python
hop per torch call inside the forward (~3 µs each, measured), small beside the padded
products and the blockwise attention. ``Numerics`` is the registry's seam: ``standard``
(the null object: the model as is, the configured backend) or ``batch_invariant``.

The invariance of the padded products is a measured property of the BLAS, not a promise
of it, so ``BatchInvariantNumerics.prepare`` checks it on the model's own weight shapes at
start-up and refuses deterministic mode (``DeterminismUnavailable``, exit 2) where it does
not hold, rather than run non-deterministically under the flag.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from engine.core.forward_batch import ForwardBatch
from engine.errors import EngineInputError
from engine.kv.cache import KVCache
from engine.model.base import CausalLM
from engine.model.compiled import EagerStep, StepCompiler, step_compiler
from kernels.invariant.matmul import invariant_linear
from kernels.linear import plain_linears

INVARIANT_BACKEND = "invariant"

log = logging.getLogger(__name__)


class DeterminismUnavailable(EngineInputError):
    """Deterministic mode cannot hold on this machine, device or backend choice."""


class BatchInvariantMode(TorchFunctionMode):
    """While active (on this thread), ``F.linear`` computes each row as if alone."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            return invariant_linear(*args, **kwargs)
        return func(*args, **kwargs)


class BatchInvariantModel(CausalLM):
    """``model`` run under ``BatchInvariantMode``; parameters stay the wrapped model's."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__()
        self.inner = model
        self.spec = model.spec

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        # Plain F.linear calls, so that the mode sees (and pads) every product.
        with plain_linears(), BatchInvariantMode():
            return self.inner(batch, kv)


class Numerics(ABC):
    """How an engine computes: which attention backend, and what runs the model.

    ``backend_name(requested)`` returns the backend to resolve (``requested`` is the
    config's, ``None`` for the device's default) or raises ``DeterminismUnavailable``;
    ``prepare(model)`` returns the module the runner calls (the model itself, or a
    wrapper with the same contract, ``CausalLM``), after any start-up check."""

    name: str

    @abstractmethod
    def backend_name(self, requested: str | None) -> str | None: ...

    @abstractmethod
    def prepare(self, model: CausalLM) -> CausalLM: ...

    @abstractmethod
    def compiler(self, requested: bool) -> StepCompiler:
        """What compiles the model's step (``--compile``: ``requested``)."""


class StandardNumerics(Numerics):
    """The null object: the fastest kernels, results that may depend on the batch."""

    name = "standard"

    def backend_name(self, requested: str | None) -> str | None:
        return requested

    def prepare(self, model: CausalLM) -> CausalLM:
        return model

    def compiler(self, requested: bool) -> StepCompiler:
        return step_compiler(requested)


class BatchInvariantNumerics(Numerics):
    name = "batch_invariant"

    def backend_name(self, requested: str | None) -> str | None:
        if requested not in (None, INVARIANT_BACKEND):
            raise DeterminismUnavailable(
                f"--deterministic uses the {INVARIANT_BACKEND!r} attention backend; "
                f"--attention-backend {requested} cannot be batch-invariant")
        return INVARIANT_BACKEND

    def prepare(self, model: CausalLM) -> CausalLM:
        check_linears(model)
        return BatchInvariantModel(model)

    def compiler(self, requested: bool) -> StepCompiler:
        # A compiled graph calls its kernels directly: the mode would see no F.linear to
        # pad, and inductor's fused loops are not checked for batch invariance.
        if requested:
            log.warning("--compile is off under --deterministic (a compiled step would "
                        "bypass the batch-invariant products); running eager")
        return EagerStep()


NUMERICS: dict[bool, type[Numerics]] = {False: StandardNumerics, True: BatchInvariantNumerics}


def numerics_for(deterministic: bool) -> Numerics:
    return NUMERICS[deterministic]()


# Batch sizes the start-up check tries a probe row in (1 alone, ragged, a decode batch, a
# prefill chunk); a handful of rows at the model's real shapes.
_PROBE_ROWS = (1, 3, 8, 21, 64)


def check_linears(model: nn.Module) -> None:
    """Raise ``DeterminismUnavailable`` unless every distinct (in, out, dtype) shape of the
    model's linear layers (and its logits) gives a row the same bits alone and in a batch."""
    shapes: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}
    for mod in model.modules():
        # Tied embeddings make the logits from the embedding matrix.
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            w = mod.weight
            shapes.setdefault((w.shape[1], w.shape[0], w.dtype, w.device), w)
    if any(dev.type != "cpu" for *_, dev in shapes):
        raise DeterminismUnavailable("--deterministic is implemented for the CPU only")
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for (k, n, dtype, _), w in shapes.items():
            x = torch.randn(max(_PROBE_ROWS), k, generator=gen).to(dtype)
            alone = invariant_linear(x[:1], w)
            for rows in _PROBE_ROWS[1:]:
                if not torch.equal(invariant_linear(x[:rows], w)[:1], alone):
                    raise DeterminismUnavailable(
                        f"this machine's BLAS gives a {k}x{n} {str(dtype)[6:]} product "
                        f"different bits for one row alone and among {rows} rows, even "
                        f"padded; deterministic mode cannot hold here")
