"""The store namespace of an engine (DESIGN §3, §11): which blocks it may share.

Everything that changes the bytes of a block's K/V is in it: the checkpoint (its name and
the revision digest of its tensors and KV-relevant config), the KV dtype, the layers the
blocks carry, the head geometry and the block size; and the tenant the store's token maps
to, so an engine never registers a namespace the daemon would refuse and tenants never
share hits.
"""

from __future__ import annotations

import torch

from engine.model.spec import ModelSpec
from kvstore.keys import Namespace


def kv_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the store's ``kv_dtype`` spelling)."""
    return str(dtype).removeprefix("torch.")


def cached_layers(spec: ModelSpec) -> tuple[int, ...]:
    """The layers a stored block carries: all of them. Bounded replay (a later issue) keeps
    only the full-attention layers; this is the one place that decides it."""
    return tuple(range(spec.num_layers))


def engine_namespace(spec: ModelSpec, block_tokens: int, tenant: str = "") -> Namespace:
    return Namespace(
        model_id=spec.model_id,
        model_revision=spec.revision,
        kv_dtype=kv_dtype_name(spec.dtype),
        kv_layout="mha",
        cached_layers=cached_layers(spec),
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_tokens=block_tokens,
        tenant=tenant,
    )
