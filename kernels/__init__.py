"""Paged attention that reads cached KV blocks where they lie, through block tables.

Pool layout, per layer, for K and for V: ``[num_blocks, block_tokens, kv_heads, head_dim]``.
The store's payload layout (DESIGN §4) is ``[len(cached_layers), 2, block_tokens,
kv_heads, head_dim]`` per block. This package imports nothing else of the project.
"""

from kernels.api import (
    check_step_metadata,
    debug_checks,
    paged_decode_attention,
    paged_prefill_attention,
    read_kv_blocks,
    write_kv_blocks,
    write_kv_slots,
)
from kernels.backend import (
    AttentionBackend,
    BackendEntry,
    backend_names,
    default_backend_name,
    get_backend,
    register_backend,
    resolve_backend,
)
from kernels.errors import BackendUnavailable, BlockTableError, KernelArgumentError, KernelError

__all__ = [
    "AttentionBackend",
    "BackendEntry",
    "BackendUnavailable",
    "BlockTableError",
    "KernelArgumentError",
    "KernelError",
    "backend_names",
    "check_step_metadata",
    "debug_checks",
    "default_backend_name",
    "get_backend",
    "paged_decode_attention",
    "paged_prefill_attention",
    "read_kv_blocks",
    "register_backend",
    "resolve_backend",
    "write_kv_blocks",
    "write_kv_slots",
]
