"""The attention backend contract and the registry that picks one.

A backend implements the five kernel entry points on arguments that ``kernels.checks``
already validated; it never re-validates and never falls back silently to another
backend. Backends are registered by import path so that ``import kernels`` does not
import Triton (or ``torch_npu``) on machines that lack them.
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.errors import BackendUnavailable, KernelArgumentError


class AttentionBackend(ABC):
    """Paged attention and KV copies over per-layer pools ``[num_blocks, block_tokens,
    kv_heads, head_dim]``.

    Contract shared by every backend (the reference defines the numbers):

    - query head ``h`` reads KV head ``h // (num_heads // kv_heads)`` (grouped-query
      attention, as transformers' ``repeat_kv``);
    - a sequence of ``seq_len`` tokens whose chunk holds ``q_len`` queries places them at
      positions ``seq_len - q_len … seq_len - 1`` (bottom-right causal alignment); key ``j``
      is visible to the query at position ``i`` iff ``j <= i``, ``i - j < window`` when a
      window is given, and ``j >= kv_start`` when ``kv_start`` is given;
    - a query row that sees no key returns zeros (the checks make that impossible for the
      engine's calls: every query sees at least itself);
    - outputs have the query's dtype; accumulation is in float32.
    """

    name: str

    @abstractmethod
    def write_kv_slots(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store token ``t``'s K/V at flat slot ``slot_mapping[t]`` (block × block_tokens +
        offset) of one layer's pools; a negative slot skips that token."""

    @abstractmethod
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
        """Ragged prefill chunks ``q[cu[b]:cu[b+1]]`` against their sequences' paged KV."""

    @abstractmethod
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
        """One query per sequence, at position ``seq_len - 1``."""

    @abstractmethod
    def read_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        out: torch.Tensor,
    ) -> None:
        """``out[i, l, 0/1] = k/v_pools[layers[l]][block_ids[i]]`` (the store's payload
        layout, DESIGN §4), with no Python loop per block."""

    @abstractmethod
    def write_kv_blocks(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        block_ids: torch.Tensor,
        layers: Sequence[int],
        src: torch.Tensor,
    ) -> None:
        """The inverse of ``read_kv_blocks``."""


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """Where a backend lives and which device types it serves."""

    module: str
    cls: str
    device_types: tuple[str, ...]


_REGISTRY: dict[str, BackendEntry] = {
    "torch": BackendEntry("kernels.torch_ref", "TorchBackend", ("cpu", "cuda", "npu", "mps")),
    # Batch-invariant attention (a fixed key order per query row): deterministic mode's.
    "invariant": BackendEntry("kernels.invariant", "InvariantBackend", ("cpu",)),
    # The reference with decode from a compiled C kernel reading the pool in place; refuses
    # to load when the extension is not built or its start-up self-check fails.
    "cpu_paged": BackendEntry("kernels.cpu_paged", "CpuPagedBackend", ("cpu",)),
    # CPU tensors run only under Triton's interpreter; the backend refuses them otherwise.
    "triton": BackendEntry(
        "kernels.triton_backend.backend", "TritonBackend", ("cuda", "npu", "cpu")
    ),
}
_INSTANCES: dict[str, AttentionBackend] = {}


def register_backend(name: str, entry: BackendEntry) -> None:
    """Add (or replace) a backend by import path; instantiated on first use."""
    _REGISTRY[name] = entry
    _INSTANCES.pop(name, None)
    _CPU_REFUSAL.clear()


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> AttentionBackend:
    """The backend registered as ``name``; ``BackendUnavailable`` if it cannot load here."""
    if name in _INSTANCES:
        return _INSTANCES[name]
    try:
        entry = _REGISTRY[name]
    except KeyError:
        raise KernelArgumentError(
            f"unknown attention backend {name!r}; known: {backend_names()}"
        ) from None
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        raise BackendUnavailable(f"attention backend {name!r} cannot load: {exc}") from exc
    backend = getattr(module, entry.cls)()
    _INSTANCES[name] = backend
    return backend


_log = logging.getLogger(__name__)
#: Why ``cpu_paged`` cannot be the CPU default here, once known (its self-check is not rerun
#: at every resolve, and the fallback is logged once per process).
_CPU_REFUSAL: list[str] = []


def default_backend_name(device: torch.device | str) -> str:
    """``triton`` on a GPU or NPU when it loads there; ``cpu_paged`` on a CPU when its
    extension is built and passes its self-check (one log line says why not otherwise);
    else ``torch``."""
    dev = torch.device(device)
    if dev.type in ("cuda", "npu") and "triton" in _REGISTRY:
        try:
            get_backend("triton")
        except BackendUnavailable:
            return "torch"
        return "triton"
    if dev.type == "cpu" and "cpu_paged" in _REGISTRY and not _CPU_REFUSAL:
        try:
            get_backend("cpu_paged")
        except BackendUnavailable as exc:
            _CPU_REFUSAL.append(str(exc))
            _log.warning("CPU attention falls back to the torch backend: %s", exc)
            return "torch"
        return "cpu_paged"
    return "torch"


def resolve_backend(
    backend: str | AttentionBackend | None, device: torch.device | str
) -> AttentionBackend:
    """An explicit backend object or name, else the device's default."""
    if isinstance(backend, AttentionBackend):
        return backend
    name = backend if backend is not None else default_backend_name(device)
    resolved = get_backend(name)
    dev_type = torch.device(device).type
    if dev_type not in _REGISTRY[name].device_types:
        raise BackendUnavailable(
            f"attention backend {name!r} does not run on {dev_type!r} tensors "
            f"(it serves {list(_REGISTRY[name].device_types)})"
        )
    return resolved
