"""The per-row ops of a decoder layer besides its matmuls and attention, fused.

A decode step of a small model spends as long in these as in its attention: RMSNorm as six
torch calls (cast, square, mean, rsqrt, multiply, cast), RoPE as ``cat``-based
``rotate_half`` plus three products, the K/V slot write as two ``index_copy_``, SiLU then a
product, a residual add before each norm. Each is a handful of microseconds of dispatch on
a few hundred values. ``kernels/_fused.c`` does each group in one call:

- ``add_rms_norm(x, residual, w)``: ``h = residual + x`` and ``RMSNorm(h)`` in one pass;
- ``rope_write(qkv, …)``: q's and k's heads (per-head RMSNorm first when the model has
  one), rotated, q returned, k and v stored at the tokens' pool slots;
- ``gated_act(gate_up)``: ``act(gate) · up``.

``FusedOps`` is the contract; ``TorchFusedOps`` (the null object, any device and dtype) is
the torch forms, which define the numbers and which ``engine.model`` uses for its modules
too; ``CompiledFusedOps`` runs the C ops where they fit (CPU, float32 or bfloat16, the
layouts below) and the torch forms elsewhere. ``fused_ops()`` picks; ``KERNELS_FUSED=torch``
forces the torch forms (to compare, or should the C ops misbehave somewhere).

Numbers: the C ops round to bfloat16 where torch's ops do, by the same round-to-nearest-even,
so residual adds, RoPE and the K/V write are bitwise torch's; the norm's sum of squares
(another summation order) and the activations' exp (a polynomial, not Sleef's) differ at the
float32 level and so, now and then, by one bfloat16 step. Every op is row-wise (a row's
result never depends on the others): batch-invariant, as ``--deterministic`` needs.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch.nn import functional as F

from kernels.api import write_kv_slots

try:
    from kernels import _fused as _ext
except ImportError as exc:  # not built (no compiler at install time): torch forms only
    _ext = None  # type: ignore[assignment]
    IMPORT_ERROR: str = str(exc)
else:
    IMPORT_ERROR = ""

_BF16 = {torch.float32: 0, torch.bfloat16: 1}
_silu = torch._C._nn.silu
MAX_HEAD_DIM: int = _ext.limits()["max_head_dim"] if _ext is not None else 0


# --------------------------------------------------------------------------- torch forms

def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool
                   ) -> torch.Tensor:
    """RMSNorm over the last dim as transformers computes it. Both styles normalise in
    float32; Llama's (``one_plus`` False) casts back to ``x``'s dtype, then scales by
    ``weight``; Gemma's scales by ``1 + weight`` still in float32 and casts at the end. The
    order of cast and scale matters in bfloat16."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if one_plus:
        return (h * (1.0 + weight.float())).to(dtype)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def torch_apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                       ) -> torch.Tensor:
    """``x`` (``[tokens, heads, head_dim]``) rotated by its tokens' ``cos``/``sin``
    (``[tokens, 1, head_dim]``, the two halves alike)."""
    return x * cos + rotate_half(x) * sin


def torch_gated_act(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """``act(gate) · up`` for ``gate_up`` = gate's columns then up's; ``act`` SiLU, or with
    ``gelu`` transformers' ``gelu_pytorch_tanh``."""
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    return act.mul_(up)


# --------------------------------------------------------------------------- the contract

class FusedOps(ABC):
    """Contract (every method, every implementation): the result equals the torch forms'
    within one bfloat16 rounding step per element (bitwise where the module docstring says
    so), row by row; inputs are never modified; results are new tensors.

    - ``rms_norm(x, w, eps, one_plus)``: ``torch_rms_norm`` over ``x``'s last dim;
    - ``add_rms_norm(x, residual, w, eps, one_plus)`` -> ``(normed, h)`` with ``h =
      residual + x`` (rounded once to the dtype, as torch's add) and ``normed`` its norm;
    - ``gated_act(gate_up, gelu)``: ``torch_gated_act``;
    - ``rope_write(qkv, heads, kv_heads, head_dim, cos, sin, q_w, k_w, eps, one_plus,
      k_pool, v_pool, slots, backend)``: ``qkv`` ``[tokens, (heads + 2·kv_heads)·head_dim]``
      (q's heads, k's, v's); q and k normalised per head by ``q_w``/``k_w`` when given
      (``torch_rms_norm``), both rotated (``torch_apply_rotary``); k and v stored at flat
      pool slot ``slots[t]`` of ``k_pool``/``v_pool`` (``kernels.write_kv_slots``: a
      negative slot skips the token; the slots were validated for the step); returns q
      ``[tokens, heads, head_dim]``.
    """

    name: str

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool
                 ) -> torch.Tensor: ...

    @abstractmethod
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def gated_act(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor: ...

    def add_rms_norm_(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``add_rms_norm`` for a caller that gives ``residual`` up: ``h`` may be
        ``residual`` itself, overwritten (the same bits either way)."""
        return self.add_rms_norm(x, residual, weight, eps, one_plus)

    @abstractmethod
    def rope_write(self, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, q_w: torch.Tensor | None,
                   k_w: torch.Tensor | None, eps: float, one_plus: bool,
                   k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                   backend: object = None) -> torch.Tensor: ...


class TorchFusedOps(FusedOps):
    """The null object: the torch forms, op by op, on any device and dtype."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool
                 ) -> torch.Tensor:
        return torch_rms_norm(x, weight, eps, one_plus)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + x
        return torch_rms_norm(h, weight, eps, one_plus), h

    def gated_act(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        return torch_gated_act(gate_up, gelu)

    def rope_write(self, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, q_w: torch.Tensor | None,
                   k_w: torch.Tensor | None, eps: float, one_plus: bool,
                   k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                   backend: object = None) -> torch.Tensor:
        tokens = qkv.shape[0]
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        v = qkv[:, q_size + kv_size:].view(tokens, kv_heads, head_dim)
        if q_w is not None and k_w is not None:
            q = torch_rms_norm(qkv[:, :q_size].view(tokens, heads, head_dim), q_w, eps,
                               one_plus)
            k = torch_rms_norm(qkv[:, q_size:q_size + kv_size].view(
                tokens, kv_heads, head_dim), k_w, eps, one_plus)
            q = torch_apply_rotary(q, cos, sin)
            k = torch_apply_rotary(k, cos, sin)
        else:
            # q's heads and k's are adjacent columns: one rotation covers both (the same
            # elementwise ops on the same values, so the same bits as two).
            qk = torch_apply_rotary(qkv[:, :q_size + kv_size].view(
                tokens, heads + kv_heads, head_dim), cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
        write_kv_slots(k, v, k_pool, v_pool, slots, backend=backend,  # type: ignore[arg-type]
                       validated=True)
        return q


def _rows_ok(x: torch.Tensor) -> bool:
    """A 2-D CPU tensor of float32 or bfloat16 whose rows are contiguous."""
    return (x.dim() == 2 and x.dtype in _BF16 and x.device.type == "cpu"
            and x.stride(1) == 1)


class CompiledFusedOps(TorchFusedOps):
    """``kernels/_fused.c`` for 2-D CPU float32 / bfloat16 rows (weights, pools and cos/sin
    in the same dtype); anything else goes to the torch forms it inherits."""

    name = "c"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool
                 ) -> torch.Tensor:
        if not (_rows_ok(x) and weight.dtype == x.dtype and weight.is_contiguous()):
            return torch_rms_norm(x, weight, eps, one_plus)
        rows, cols = x.shape
        out = torch.empty((rows, cols), dtype=x.dtype)
        _ext.rms_norm(out.data_ptr(), 0, x.data_ptr(), 0, weight.data_ptr(), rows, cols,
                      x.stride(0), 0, _BF16[x.dtype], int(one_plus), eps)
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if not (_rows_ok(x) and _rows_ok(residual) and residual.shape == x.shape
                and residual.dtype == x.dtype == weight.dtype and weight.is_contiguous()):
            return super().add_rms_norm(x, residual, weight, eps, one_plus)
        rows, cols = x.shape
        out = torch.empty((rows, cols), dtype=x.dtype)
        h = torch.empty((rows, cols), dtype=x.dtype)
        _ext.rms_norm(out.data_ptr(), h.data_ptr(), x.data_ptr(), residual.data_ptr(),
                      weight.data_ptr(), rows, cols, x.stride(0), residual.stride(0),
                      _BF16[x.dtype], int(one_plus), eps)
        return out, h

    def gated_act(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        # SiLU stays torch's: its vectorised Sleef kernel beat the C loop at 1-64 rows
        # (kernels/README.md); gelu-tanh, four torch kernels, does not.
        if not gelu or not _rows_ok(gate_up) or gate_up.shape[1] % 2:
            return torch_gated_act(gate_up, gelu)
        return c_gated_act(gate_up, gelu)

    def rope_write(self, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, q_w: torch.Tensor | None,
                   k_w: torch.Tensor | None, eps: float, one_plus: bool,
                   k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                   backend: object = None) -> torch.Tensor:
        dtype = qkv.dtype
        tokens = qkv.shape[0]
        if not (_rows_ok(qkv) and head_dim % 2 == 0 and head_dim <= MAX_HEAD_DIM
                and qkv.shape[1] == (heads + 2 * kv_heads) * head_dim
                and _rope_table_ok(cos, tokens, head_dim, dtype)
                and _rope_table_ok(sin, tokens, head_dim, dtype) and cos.stride() == sin.stride()
                and _pool_ok(k_pool, kv_heads, head_dim, dtype)
                and _pool_ok(v_pool, kv_heads, head_dim, dtype)
                and slots.dtype == torch.int64 and slots.dim() == 1
                and slots.shape[0] == tokens and slots.is_contiguous()
                and (q_w is None) == (k_w is None)
                and (q_w is None or _weight_ok(q_w, head_dim, dtype))
                and (k_w is None or _weight_ok(k_w, head_dim, dtype))):
            return super().rope_write(qkv, heads, kv_heads, head_dim, cos, sin, q_w, k_w, eps,
                                      one_plus, k_pool, v_pool, slots, backend)
        q = torch.empty((tokens, heads, head_dim), dtype=dtype)
        _ext.rope_write(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), qkv.data_ptr(),
                        cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                        0 if q_w is None else q_w.data_ptr(),
                        0 if k_w is None else k_w.data_ptr(), tokens, qkv.stride(0),
                        cos.stride(0), heads, kv_heads, head_dim, _BF16[dtype], int(one_plus),
                        eps)
        return q


def c_gated_act(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """The C ``act(gate) · up``, SiLU included (the ops use it for gelu-tanh only), on a
    2-D CPU float32 / bfloat16 ``gate_up`` with contiguous rows."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype)
    _ext.gated_act(out.data_ptr(), gate_up.data_ptr(), rows, inter, gate_up.stride(0),
                   _BF16[gate_up.dtype], int(gelu))
    return out


def _rope_table_ok(t: torch.Tensor, tokens: int, head_dim: int, dtype: torch.dtype) -> bool:
    """cos/sin: ``[tokens, 1, head_dim]`` (or ``[tokens, head_dim]``), rows contiguous."""
    return (t.dtype == dtype and t.device.type == "cpu" and t.shape[0] == tokens
            and t.shape[-1] == head_dim and t.numel() == tokens * head_dim
            and t.stride(-1) == 1)


def _pool_ok(pool: torch.Tensor, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    return (pool.dtype == dtype and pool.device.type == "cpu" and pool.dim() == 4
            and pool.shape[2] == kv_heads and pool.shape[3] == head_dim
            and pool.is_contiguous())


def _weight_ok(w: torch.Tensor, head_dim: int, dtype: torch.dtype) -> bool:
    return w.dtype == dtype and w.shape == (head_dim,) and w.is_contiguous()


class TrustedFusedOps(CompiledFusedOps):
    """The C ops without their per-call layout checks, for a model step whose caller
    checked once (``step_fits``) that every weight, pool, cos/sin table and slot tensor of
    the step fits and whose activations are all fresh contiguous 2-D rows of the step's
    dtype (the products' and these ops' outputs are). What stays per call is what keeps a
    wrong call from writing out of bounds: the row counts of ``rope_write``'s inputs."""

    name = "c-trusted"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool
                 ) -> torch.Tensor:
        rows, cols = x.shape
        out = torch.empty((rows, cols), dtype=x.dtype)
        _ext.rms_norm(out.data_ptr(), 0, x.data_ptr(), 0, weight.data_ptr(), rows, cols,
                      cols, 0, _BF16[x.dtype], one_plus, eps)
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = x.shape
        if residual.shape[0] != rows:
            raise ValueError(f"add_rms_norm: {rows} rows and a residual of "
                             f"{residual.shape[0]}")
        dtype = x.dtype
        out = torch.empty((rows, cols), dtype=dtype)
        h = torch.empty((rows, cols), dtype=dtype)
        _ext.rms_norm(out.data_ptr(), h.data_ptr(), x.data_ptr(), residual.data_ptr(),
                      weight.data_ptr(), rows, cols, cols, cols, _BF16[dtype], one_plus, eps)
        return out, h

    def add_rms_norm_(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, one_plus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # h written over residual row by row (each chunk read before it is written).
        rows, cols = x.shape
        if residual.shape[0] != rows:
            raise ValueError(f"add_rms_norm_: {rows} rows and a residual of "
                             f"{residual.shape[0]}")
        dtype = x.dtype
        out = torch.empty((rows, cols), dtype=dtype)
        res = residual.data_ptr()
        _ext.rms_norm(out.data_ptr(), res, x.data_ptr(), res, weight.data_ptr(), rows, cols,
                      cols, cols, _BF16[dtype], one_plus, eps)
        return out, residual

    def gated_act(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        if gelu:
            return c_gated_act(gate_up, gelu)
        # torch_gated_act's kernels (the same bits) without chunk's list and F.silu's
        # torch-function hop (a step on these ops runs under no TorchFunctionMode).
        inter = gate_up.shape[1] // 2
        return _silu(gate_up[:, :inter]).mul_(gate_up[:, inter:])

    def rope_write(self, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, q_w: torch.Tensor | None,
                   k_w: torch.Tensor | None, eps: float, one_plus: bool,
                   k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                   backend: object = None) -> torch.Tensor:
        tokens, width = qkv.shape
        if not (slots.shape[0] == tokens == cos.shape[0] == sin.shape[0]
                and width == (heads + 2 * kv_heads) * head_dim):
            raise ValueError(f"rope_write: qkv {tuple(qkv.shape)}, {slots.shape[0]} slots, "
                             f"cos/sin of {cos.shape[0]}/{sin.shape[0]} rows")
        dtype = qkv.dtype
        q = torch.empty((tokens, heads, head_dim), dtype=dtype)
        _ext.rope_write(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), qkv.data_ptr(),
                        cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                        0 if q_w is None else q_w.data_ptr(),
                        0 if k_w is None else k_w.data_ptr(), tokens, width, head_dim,
                        heads, kv_heads, head_dim, _BF16[dtype], one_plus, eps)
        return q


def step_fits(dtype: torch.dtype, head_dim: int, kv_heads: int,
              weights: Sequence[torch.Tensor], pools: Sequence[torch.Tensor],
              tables: Sequence[torch.Tensor], slots: Sequence[torch.Tensor]) -> bool:
    """Whether a step's arguments fit ``TrustedFusedOps`` (checked once per step): the
    dtype is float32 or bfloat16 and the C ops are built; every norm weight (1-D) is of
    the dtype and contiguous; every pool is a contiguous CPU ``[blocks, block_tokens,
    kv_heads, head_dim]`` of the dtype; every cos/sin table is ``[tokens, 1, head_dim]``
    (or ``[tokens, head_dim]``) of the dtype, contiguous; every slot tensor is a contiguous
    1-D int64 CPU tensor."""
    if _ext is None or dtype not in _BF16 or head_dim % 2 or head_dim > MAX_HEAD_DIM:
        return False
    if not all(w.dtype == dtype and w.dim() == 1 and w.is_contiguous() for w in weights):
        return False
    if not all(_pool_ok(p, kv_heads, head_dim, dtype) for p in pools):
        return False
    if not all(_rope_table_ok(t, t.shape[0], head_dim, dtype) and t.is_contiguous()
               for t in tables):
        return False
    return all(s.dtype == torch.int64 and s.dim() == 1 and s.device.type == "cpu"
               and s.is_contiguous() for s in slots)


TORCH_OPS = TorchFusedOps()
_COMPILED_OPS = CompiledFusedOps() if _ext is not None else None
TRUSTED_OPS: FusedOps | None = TrustedFusedOps() if _ext is not None else None
FUSED_OPS: dict[str, FusedOps] = {"torch": TORCH_OPS}
if _COMPILED_OPS is not None:
    FUSED_OPS["c"] = _COMPILED_OPS


def fused_ops() -> FusedOps:
    """The C ops when built (each call falls back to the torch forms where it does not fit),
    unless ``KERNELS_FUSED=torch``; the torch forms while ``torch.compile`` traces (inductor
    fuses them itself, and cannot trace into the C calls)."""
    if (torch.compiler.is_compiling() or _COMPILED_OPS is None
            or os.environ.get("KERNELS_FUSED") == "torch"):
        return TORCH_OPS
    return _COMPILED_OPS


def set_parallel_min_elements(n: int) -> int:
    """From how many elements a C call runs on an OpenMP team (default 65536: a decode
    step's 1–8 rows never do); returns the previous value. For the benchmark."""
    if _ext is None:
        return 0
    return int(_ext.set_par_min_elems(int(n)))
