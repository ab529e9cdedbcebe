"""The Triton backend class: plans each launch, allocates split-KV scratch, launches."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernels.backend import AttentionBackend
from kernels.errors import BackendUnavailable, KernelArgumentError
from kernels.torch_ref import copies
from kernels.triton_backend import launch
from kernels.triton_backend.attention_kernels import merge_splits_kernel, paged_attention_kernel
from kernels.triton_backend.copy_kernels import write_kv_slots_kernel
from kernels.triton_backend.plan import MAX_GRID_YZ, TritonConfig, plan_attention


@dataclass(frozen=True, slots=True)
class Kernels:
    attention: Any
    merge: Any
    write_slots: Any


@functools.cache
def build(interpret: bool) -> Kernels:
    """The kernels wrapped for the compiler or for the interpreter (once per mode)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def wrap(fn: Callable[..., None]) -> Any:
        if interpret:
            return InterpretedFunction(fn)
        return JITFunction(fn, do_not_specialize=launch.NOT_SPECIALIZED[fn.__name__])

    return Kernels(wrap(paged_attention_kernel), wrap(merge_splits_kernel),
                   wrap(write_kv_slots_kernel))


def interpreting() -> bool:
    """Whether this process's Triton was imported in interpreter mode."""
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.zeros, InterpretedFunction)


@functools.cache
def _core_count(device: torch.device) -> int:
    """Streaming multiprocessors (CUDA) or AI cores (Ascend) of the device."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        for key in ("multiprocessor_count", "num_aicore", "num_vectorcore"):
            if props.get(key):
                return int(props[key])
    except Exception:  # a driver without the query: plan for a mid-sized device
        pass
    return 32


def _run(kernel: Any, spec: launch.Launch) -> None:
    kernel[spec.grid](*spec.args, **spec.constexprs, **spec.options)


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self, config: TritonConfig | None = None):
        self.interpret = interpreting()
        self.config = config or TritonConfig()
        self._kernels = build(self.interpret)

    def _device(self, t: torch.Tensor) -> torch.device:
        if t.device.type == "cpu" and not self.interpret:
            raise BackendUnavailable(
                "the triton backend runs on CUDA or NPU tensors (CPU tensors only when "
                "TRITON_INTERPRET=1 was set before triton was imported); use backend='torch'"
            )
        return t.device

    def write_kv_slots(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        self._device(k_pool)
        if k.shape[0]:
            _run(self._kernels.write_slots,
                 launch.write_slots_launch(k, v, k_pool, v_pool, slot_mapping))

    def paged_prefill_attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        kv_start: torch.Tensor | None,
    ) -> torch.Tensor:
        longest = (0, 0)
        if seq_lens.numel():
            q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
            longest = tuple(torch.stack([q_lens.max(), seq_lens.max()]).tolist())
        return self._attend(q, k_pool, v_pool, cu_seqlens_q, block_tables, seq_lens, scale,
                            window, kv_start, decode=False, max_q_len=int(longest[0]),
                            max_seq_len=int(longest[1]))

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        kv_start: torch.Tensor | None,
    ) -> torch.Tensor:
        max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
        return self.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, scale, window,
                                 kv_start, max_seq_len=max_seq_len)

    def paged_decode(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None = None,
        kv_start: torch.Tensor | None = None,
        *,
        max_seq_len: int,
    ) -> torch.Tensor:
        """Decode on arguments already checked, with the longest ``seq_len`` known on the
        host (``>=`` the true one), so nothing waits on the device: what a CUDA-graph
        step or a benchmark calls."""
        return self._attend(q, k_pool, v_pool, seq_lens, block_tables, seq_lens, scale,
                            window, kv_start, decode=True, max_q_len=1,
                            max_seq_len=max_seq_len)

    def _attend(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        kv_start: torch.Tensor | None,
        *,
        decode: bool,
        max_q_len: int,
        max_seq_len: int,
    ) -> torch.Tensor:
        device = self._device(q)
        tokens, heads, head_dim = q.shape
        kv_heads = k_pool.shape[2]
        batch = seq_lens.shape[0]
        out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=device)
        if tokens == 0 or batch == 0:
            return out
        if batch > MAX_GRID_YZ:
            raise KernelArgumentError(f"a batch of {batch} sequences exceeds the triton "
                                      f"backend's {MAX_GRID_YZ} per launch")
        plan = plan_attention(
            self.config, decode=decode, batch=batch, kv_heads=kv_heads,
            group=heads // kv_heads, head_dim=head_dim, elem_bytes=q.element_size(),
            total_q=tokens, max_q_len=max_q_len, max_seq_len=max_seq_len, window=window,
            cores=0 if self.interpret else _core_count(device),
        )
        part_o = part_lse = out  # placeholders, unread without splits
        if plan.num_splits > 1:
            part_o = torch.empty((tokens, heads, plan.num_splits, head_dim),
                                 dtype=torch.float32, device=device)
            part_lse = torch.empty((tokens, heads, plan.num_splits), dtype=torch.float32,
                                   device=device)
        _run(self._kernels.attention, launch.attention_launch(
            plan, q, k_pool, v_pool, out, part_o, part_lse, cu_seqlens_q, block_tables,
            seq_lens, kv_start, scale, window, decode=decode, interpret=self.interpret,
        ))
        if plan.num_splits > 1:
            _run(self._kernels.merge, launch.merge_launch(plan, part_o, part_lse, out))
        return out

    def read_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        out: torch.Tensor,
    ) -> None:
        self._device(k_pools[0])
        copies.read_kv_blocks(k_pools, v_pools, block_ids, layers, out)

    def write_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        src: torch.Tensor,
    ) -> None:
        self._device(k_pools[0])
        copies.write_kv_blocks(k_pools, v_pools, block_ids, layers, src)


__all__ = ["TritonBackend", "TritonConfig", "build", "interpreting"]
