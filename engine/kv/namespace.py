"""The store namespaces of an engine (DESIGN §3, §11): which blocks it may share.

Everything that changes the bytes of a block's K/V is in them: the checkpoint (its name and
the revision digest of its tensors and KV-relevant config), the KV dtype, the layers the
blocks carry, the head geometry and the block size; and the tenant the store's token maps
to, so an engine never registers a namespace the daemon would refuse and tenants never
share hits. Which layers go into which namespace is the replay policy's decision
(``bounded_replay.stored_namespaces``): a hybrid model keeps the sliding layers in a second
namespace (exact mode every block's, bounded mode the window tails of committed ends).
"""

from __future__ import annotations

import torch

from bounded_replay import ReplayPolicy, StoredNamespaces, resolve_policy, stored_namespaces
from engine.model.spec import ModelSpec
from kvstore.keys import Namespace
from kvstore.prefix_key import XXH3, PrefixHash


def kv_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the store's ``kv_dtype`` spelling)."""
    return str(dtype).removeprefix("torch.")


def all_layers_namespace(spec: ModelSpec, block_tokens: int, tenant: str = "",
                         prefix_hash: PrefixHash = XXH3) -> Namespace:
    """Every layer of the model in one namespace: what a model with one kind of layer
    stores, and the base the replay policy derives its namespaces from. ``prefix_hash``:
    xxh3 chain keys, or keyed blake2b on a multi-user server (``kvstore.prefix_key``)."""
    return prefix_hash.apply(Namespace(
        model_id=spec.model_id,
        model_revision=spec.revision,
        kv_dtype=kv_dtype_name(spec.dtype),
        kv_layout="mha",
        cached_layers=tuple(range(spec.num_layers)),
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_tokens=block_tokens,
        tenant=tenant,
    ))


def engine_namespaces(spec: ModelSpec, block_tokens: int, policy: ReplayPolicy,
                      tenant: str = "", prefix_hash: PrefixHash = XXH3) -> StoredNamespaces:
    return stored_namespaces(all_layers_namespace(spec, block_tokens, tenant, prefix_hash),
                             policy)


def engine_namespace(spec: ModelSpec, block_tokens: int, tenant: str = "",
                     policy: ReplayPolicy | None = None,
                     prefix_hash: PrefixHash = XXH3) -> Namespace:
    """The primary namespace (the one a store link is opened for); ``policy`` None is the
    model's default policy."""
    policy = policy or resolve_policy(spec.layer_windows)
    return engine_namespaces(spec, block_tokens, policy, tenant, prefix_hash).primary
