"""Matmuls with weights that do not change: ``y = x @ W.T (+ b)``, as ``F.linear``.

Decode multiplies one row (or a few) by every weight matrix of the model, so its time is
the weights' bytes read once per step. ``F.linear`` on a CPU hands oneDNN a plain
row-major weight, which oneDNN re-lays out (or reads with a slow GEMV) on every call; a
weight reordered once into oneDNN's blocked layout (``mkldnn._reorder_linear_weight``,
what inductor's weight freezing and vLLM-CPU's oneDNN GEMM do) halves a bf16 GEMV on this
machine class and computes the same bits (``tests/kernels/test_linear.py``).

A packed GEMM is still a general GEMM: for decode's one to a few rows a bf16 weight streams
at about 60 % of DRAM bandwidth through oneDNN. ``Bf16GemvLinear`` (``bf16gemv``,
``kernels/gemv.py`` over ``kernels/_gemv.c``) packs the weight for a skinny-GEMM kernel
that streams it near DRAM speed for decode and keeps up with oneDNN on a prefill's many
rows, so the model holds one prepared form.

``LinearKernel`` is the contract; ``DenseLinear`` (plain ``F.linear``) is the null object
that every device and dtype can use; ``select_linear_kernel`` picks. ``KERNELS_LINEAR=name``
forces a kernel (``dense``, ``onednn``, ``bf16gemv``: to compare, or if one misbehaves).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kernels import gemv

#: Row count the blocked layout is tuned for: decode's (one row per sequence).
PACK_HINT_ROWS = 1


class LinearKernel(ABC):
    """Contract: ``apply(x, prepare(w), b)`` equals ``F.linear(x, w, b)`` for a 2-D ``x``
    on ``w``'s device and dtype; ``prepare`` runs once per weight version and may return any
    object (kept beside the weight by ``PreparedWeight``)."""

    name: str

    @abstractmethod
    def prepare(self, weight: torch.Tensor) -> object: ...

    @abstractmethod
    def apply(self, x: torch.Tensor, prepared: object, bias: torch.Tensor | None
              ) -> torch.Tensor: ...


class DenseLinear(LinearKernel):
    name = "dense"

    def prepare(self, weight: torch.Tensor) -> object:
        return weight

    def apply(self, x: torch.Tensor, prepared: object, bias: torch.Tensor | None
              ) -> torch.Tensor:
        assert isinstance(prepared, torch.Tensor)
        return F.linear(x, prepared, bias)


class OneDnnPackedLinear(LinearKernel):
    """bf16 on a CPU with oneDNN: the weight reordered once into oneDNN's blocked layout."""

    name = "onednn"

    def prepare(self, weight: torch.Tensor) -> object:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT_ROWS)

    def apply(self, x: torch.Tensor, prepared: object, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, prepared, bias, "none", [None], "")


class Bf16GemvLinear(LinearKernel):
    """bf16 on a CPU: the weight packed once for the compiled skinny GEMM (``kernels/gemv.py``,
    ``kernels/_gemv.c``), which streams it at DRAM speed for decode's few rows and reuses it
    from cache for a prefill's many, so one prepared form serves both."""

    name = "bf16gemv"

    def prepare(self, weight: torch.Tensor) -> object:
        return gemv.pack(weight)

    def apply(self, x: torch.Tensor, prepared: object, bias: torch.Tensor | None
              ) -> torch.Tensor:
        assert isinstance(prepared, gemv.PackedWeight)
        if bias is not None and bias.dtype != torch.bfloat16:
            bias = bias.to(torch.bfloat16)
        return gemv.linear(x, prepared, bias)


_DENSE = DenseLinear()
_ONEDNN = OneDnnPackedLinear()
_GEMV = Bf16GemvLinear()
LINEAR_KERNELS: dict[str, LinearKernel] = {k.name: k for k in (_DENSE, _ONEDNN, _GEMV)}


def _onednn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def select_linear_kernel(weight: torch.Tensor) -> LinearKernel:
    """The kernel for this weight. For bf16 on a CPU: ``bf16gemv`` where its extension is
    built, the CPU has AVX512-BF16 and its start-up self-check passed, else oneDNN's packed
    GEMM where oneDNN has bf16; ``F.linear`` for everything else. ``KERNELS_LINEAR=<name>``
    forces a kernel wherever it can run (``bf16gemv`` then takes its portable path on a CPU
    without AVX512-BF16); where it cannot, ``F.linear``."""
    forced = os.environ.get("KERNELS_LINEAR")
    if forced in LINEAR_KERNELS:
        kernel = LINEAR_KERNELS[forced]
        return kernel if _runs(kernel, weight) else _DENSE
    if _runs(_GEMV, weight) and gemv.usable_as_default():
        return _GEMV
    return _ONEDNN if _runs(_ONEDNN, weight) else _DENSE


def _runs(kernel: LinearKernel, weight: torch.Tensor) -> bool:
    if kernel is _DENSE:
        return True
    bf16_cpu = (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
                and weight.dim() == 2)
    if kernel is _GEMV:
        return bf16_cpu and gemv.built()
    return bf16_cpu and _onednn_bf16()


@dataclass(frozen=True, slots=True)
class _Prepared:
    key: tuple[int, int, torch.dtype, torch.device]
    kernel: LinearKernel
    value: object


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor has no version counter: it cannot change
        return -1


_local = threading.local()


@contextmanager
def plain_linears() -> Iterator[None]:
    """While active on this thread, every ``PreparedWeight`` computes with ``F.linear`` on
    the weight as given. For a caller that intercepts ``F.linear``: batch-invariant
    numerics pads the rows of each product so a row's bits never depend on its batch, and a
    prepared oneDNN weight would bypass it (its GEMM's blocking follows the row count)."""
    before = getattr(_local, "plain", False)
    _local.plain = True
    try:
        yield
    finally:
        _local.plain = before


def plain_linears_active() -> bool:
    """Whether ``plain_linears`` is active on this thread (a caller that binds prepared
    products ahead of time must not use them then)."""
    return bool(getattr(_local, "plain", False))


#: How a ``PreparedWeight`` appears in a graph ``torch.compile`` traces: ``"opaque"``, the
#: custom op ``kernels::prepared_linear`` (this module's packed GEMM, called as is);
#: ``"inductor"``, a plain ``F.linear`` that inductor lowers itself (with weight freezing it
#: packs the weight for oneDNN too, and may fuse the bias and what follows).
COMPILED_LINEAR_MODES = ("opaque", "inductor")
compiled_linear_mode = "opaque"

_handles = itertools.count()
_by_handle: weakref.WeakValueDictionary[int, PreparedWeight] = weakref.WeakValueDictionary()


class PreparedWeight:
    """A weight's prepared form, rebuilt when the weight changes (a new tensor, an in-place
    write: ``_version``), so loading new weights into a module needs no extra call."""

    __slots__ = ("__weakref__", "_cached", "_handle")

    def __init__(self) -> None:
        self._cached: _Prepared | None = None
        # The name a compiled graph calls this object by (``kernels::prepared_linear``).
        self._handle = next(_handles)
        _by_handle[self._handle] = self

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
               ) -> torch.Tensor:
        if torch.compiler.is_compiling():
            if compiled_linear_mode == "inductor":
                return F.linear(x, weight, bias)
            return prepared_linear(x, weight, bias, self._handle)
        if x.dim() != 2 or x.dtype != weight.dtype or getattr(_local, "plain", False):
            return F.linear(x, weight, bias)
        key = (weight.data_ptr(), _version(weight), weight.dtype, weight.device)
        cached = self._cached
        if cached is None or cached.key != key:
            kernel = select_linear_kernel(weight)
            cached = _Prepared(key, kernel, kernel.prepare(weight))
            self._cached = cached
        return cached.kernel.apply(x, cached.value, bias)

    def clear(self) -> None:
        self._cached = None

    def prepared_for(self, weight: torch.Tensor) -> tuple[LinearKernel, object] | None:
        """The kernel and prepared value ``linear`` would use for ``weight`` now, or None
        when it has not prepared this weight as it is (another tensor, a newer version)."""
        cached = self._cached
        key = (weight.data_ptr(), _version(weight), weight.dtype, weight.device)
        if cached is None or cached.key != key:
            return None
        return cached.kernel, cached.value


@torch.library.custom_op("kernels::prepared_linear", mutates_args=())
def prepared_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    handle: int) -> torch.Tensor:
    """``PreparedWeight`` number ``handle``'s product, as one opaque call in a compiled
    graph (the graph cannot hold the prepared oneDNN weight itself)."""
    return _by_handle[handle].linear(x, weight, bias)


@prepared_linear.register_fake
def _prepared_linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          handle: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
