"""A compiled model step (``kvengine … --compile``): ``torch.compile`` over the dense parts.

``DecoderLM.dense_step`` (embeddings, norms, projections, RoPE, the MLPs, residual adds,
logits) goes through inductor's CPU C++ backend as one graph: inductor fuses the ~15
elementwise ops of each layer into a few C++ loops and drops their Python dispatch. Each
layer's KV-slot write and attention stay outside as one opaque op
(``engine.model.attention_op``), so every attention backend runs unchanged and the graph
has no break per layer. The matmuls stay the engine's packed oneDNN GEMM, called as an
opaque op too (``kernels.linear.prepared_linear``; ``linear_mode="inductor"`` hands them
to inductor instead).

Recompiles are bounded: the token count and the logits row count are marked dynamic, so
one graph serves every decode batch and prefill chunk of two or more rows; torch
specialises a size of 1, so a step of one token (one decode) or one logits row gets its own
graph — at most a handful of graphs per process. Inductor caches what it builds on disk
(``TORCHINDUCTOR_CACHE_DIR``, default under ``/tmp``), so a second process starts warm.

``StepCompiler`` is the registry's seam: ``eager`` (the null object: the model as is) and
``inductor``. A model that cannot be compiled (no ``dense_step``), or a compile that fails,
logs one line and runs eager; deterministic mode never compiles (``engine.core.numerics``
runs the model under a ``TorchFunctionMode`` a graph would bypass).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.base import CausalLM
from kernels import linear as kernels_linear

log = logging.getLogger(__name__)

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


@dataclass(frozen=True, slots=True)
class CompileOptions:
    mode: str = "default"  # torch.compile's mode (COMPILE_MODES)
    linear_mode: str = "opaque"  # kernels.linear.COMPILED_LINEAR_MODES
    freezing: bool = False  # inductor folds the weights in as constants (needed by "inductor")
    cpp_wrapper: bool = False  # inductor's C++ wrapper instead of its Python one

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile mode {self.mode!r}: choose one of "
                             f"{', '.join(COMPILE_MODES)}")
        if self.linear_mode not in kernels_linear.COMPILED_LINEAR_MODES:
            raise ValueError(f"linear mode {self.linear_mode!r}: choose one of "
                             f"{', '.join(kernels_linear.COMPILED_LINEAR_MODES)}")


@dataclass(frozen=True, slots=True)
class CompileEvent:
    """One graph built (or refused): its step's token count and the seconds it took."""

    tokens: int
    seconds: float
    ok: bool


class StepCompiler(ABC):
    """Contract: ``prepare(model)`` returns a ``CausalLM`` whose ``forward`` gives the
    model's logits (bitwise for ``eager``; within the dtype's rounding for a compiler, whose
    fused loops may order a reduction differently) and writes the same KV. It never raises
    for a model it cannot compile: it returns the model as is."""

    name: str

    @abstractmethod
    def prepare(self, model: CausalLM) -> CausalLM: ...


class EagerStep(StepCompiler):
    name = "eager"

    def prepare(self, model: CausalLM) -> CausalLM:
        return model


class InductorStep(StepCompiler):
    name = "inductor"

    def __init__(self, options: CompileOptions = CompileOptions()) -> None:
        self.options = options

    def prepare(self, model: CausalLM) -> CausalLM:
        if not hasattr(model, "dense_step") or not hasattr(model, "run_step"):
            log.warning("--compile: %s has no dense step to compile; running eager",
                        type(model).__name__)
            return model
        return CompiledModel(model, self.options)


STEP_COMPILERS: dict[str, Callable[[], StepCompiler]] = {
    "eager": EagerStep, "inductor": InductorStep}


def step_compiler(compile_step: bool) -> StepCompiler:
    return STEP_COMPILERS["inductor" if compile_step else "eager"]()


# Errors that mean "this graph could not be built", as opposed to a kernel refusing its
# arguments at run time (those propagate as they would eager).
_COMPILE_ERRORS: tuple[type[BaseException], ...] = (torch._dynamo.exc.TorchDynamoException,)
try:
    from torch._inductor.exc import InductorError

    _COMPILE_ERRORS += (InductorError,)
except ImportError:  # older torch wraps inductor's errors in BackendCompilerFailed
    pass


class CompiledModel(CausalLM):
    """``model``'s steps through ``torch.compile(model.dense_step)``; parameters stay the
    wrapped model's. ``events`` records every graph built (tokens, seconds)."""

    def __init__(self, model: CausalLM, options: CompileOptions) -> None:
        super().__init__()
        self.inner = model
        self.spec = model.spec
        self.options = options
        self.failed = False
        self.events: list[CompileEvent] = []
        self._seen: set[tuple[int, int]] = set()
        inductor: dict[str, Any] = {"freezing": options.freezing or
                                    options.linear_mode == "inductor",
                                    "cpp_wrapper": options.cpp_wrapper,
                                    # Round at every cast as eager does (RMSNorm casts to
                                    # bf16 before its scale): logits stay within an ulp or
                                    # two of eager's instead of drifting over the layers.
                                    "emulate_precision_casts": True}
        dense: Callable[..., torch.Tensor] = getattr(model, "dense_step")  # noqa: B009
        self._compiled = torch.compile(
            dense, backend="inductor", fullgraph=True, dynamic=None,
            mode=None if options.mode == "default" else options.mode, options=inductor)

    def _dense(self, input_ids: torch.Tensor, positions: torch.Tensor,
               logits_indices: torch.Tensor, cut_rows: torch.Tensor | None,
               cut_layer: int) -> torch.Tensor:
        for t in (input_ids, positions, logits_indices, cut_rows):
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        kernels_linear.compiled_linear_mode = self.options.linear_mode
        if logits_indices.numel() == 0:
            # A graph whose output has no rows reads none of the layers' outputs, so
            # inductor drops them, attention ops (and their KV writes) included: ask for
            # one row and return none, so every layer still runs.
            return self._compiled(input_ids, positions, logits_indices.new_zeros(1),
                                  cut_rows, cut_layer)[:0]
        return self._compiled(input_ids, positions, logits_indices, cut_rows, cut_layer)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        cut = batch.row_cut
        if self.failed or (cut is not None and cut.rows.numel() == 0):
            # A step whose rows all stop below the last layer has no row to ask logits of,
            # and a graph without one drops its layers (``_dense``): eager, as is.
            return self.inner(batch, kv)
        # A new size class (1 row or several, of tokens and of logits) builds a graph:
        # torch specialises a size of 1, every larger size shares one dynamic graph.
        shape = (min(batch.num_tokens, 2), max(1, min(int(batch.logits_indices.shape[0]), 2)))
        first = shape not in self._seen
        t0 = time.perf_counter()
        try:
            out: torch.Tensor = self.inner.run_step(batch, kv, self._dense)  # type: ignore[operator]
        except _COMPILE_ERRORS as e:
            self.failed = True
            self.events.append(CompileEvent(batch.num_tokens, time.perf_counter() - t0, False))
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            log.warning("--compile: compiling the model step failed (%s: %s); running eager",
                        type(e).__name__, first_line[:200])
            return self.inner(batch, kv)
        if first:
            self._seen.add(shape)
            self.events.append(CompileEvent(batch.num_tokens, time.perf_counter() - t0, True))
        return out
