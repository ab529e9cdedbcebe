"""The store namespace of a checkpoint served by vLLM: the one ``kvengine`` computes.

``kvengine`` names a checkpoint's blocks by its architecture, the revision digest of its
tensors, KV-relevant config and dtype, its layers and head geometry, the store's block size
and the tenant (``engine.kv.namespace``, ``engine.model.revision``; DESIGN §3, §11). The
connector calls the same functions on the directory vLLM loads, without loading the
weights, so vLLM and ``kvengine`` share blocks wherever layout and dtype agree. A request's
``cache_salt`` is folded in as ``kvengine serve`` does (``engine.kv.request_scope``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.kv.namespace import all_layers_namespace
from engine.kv.request_scope import RequestScope
from engine.model.loader import checkpoint_spec
from engine.model.spec import ModelSpec
from kvstore.keys import Namespace
from kvstore.prefix_key import XXH3, PrefixHash


class UnsupportedModel(ValueError):
    """A checkpoint whose vLLM KV the connector cannot store as ``kvengine`` would (one line)."""


def checkpoint_model_spec(model_dir: str, dtype: torch.dtype) -> ModelSpec:
    """The spec (revision included) of the checkpoint directory vLLM loads as ``dtype``."""
    path = Path(model_dir)
    if not path.is_dir():
        raise UnsupportedModel(
            f"KVStoreConnector: model {model_dir!r} is not a local checkpoint directory; the "
            "store namespace is the digest of its files (download it first)"
        )
    spec = checkpoint_spec(path, dtype=dtype)[0]
    if spec.sliding_layers:
        # vLLM keeps every layer's KV of a hybrid model; kvengine stores the full-attention
        # layers only (bounded replay): their blocks would not be interchangeable.
        raise UnsupportedModel(
            f"KVStoreConnector: {spec.architecture} has sliding-window layers; only models "
            "with full attention in every layer are supported"
        )
    return spec


def base_namespace(
    spec: ModelSpec, block_tokens: int, tenant: str = "", prefix_hash: PrefixHash = XXH3
) -> Namespace:
    """Every layer in one namespace: what ``kvengine`` stores for such a model, its chain
    keys hashed as the deployment's ``kvengine serve`` hashes them (``prefix_key_file``)."""
    return all_layers_namespace(spec, block_tokens, tenant, prefix_hash)


def request_namespace(base: Namespace, cache_salt: str | None) -> Namespace:
    """``base`` for a request carrying ``cache_salt`` (vLLM's per-request isolation)."""
    return RequestScope(cache_salt=cache_salt).apply(base)
