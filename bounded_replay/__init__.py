"""Bounded replay (DESIGN §11): on a cache hit recompute only a bounded tail of the hit.

``resolve_policy`` picks the mode and ``keep`` for a model (with the safe defaults and the
refusals), ``stored_namespaces`` says what the store keeps under it, and ``plan_replay``
turns one hit into a ``ReplayPlan``: which cached KV to load for which layers, where the
replay starts, which KV it recomputes, and the sliding layers' ``kv_start``. Pure
functions of lengths and layer windows; no engine, no store.
"""

from bounded_replay.errors import (
    KeepTooSmall,
    NoFullAttentionLayer,
    PlanInputError,
    ReplayError,
    ReplayRefused,
)
from bounded_replay.layers import LayerLayout
from bounded_replay.measured import MEASURED_FIDELITY, MeasuredKeep
from bounded_replay.namespaces import StoredNamespaces, stored_namespaces
from bounded_replay.plan import (
    KVRange,
    ReplayPlan,
    longest_exact_hit,
    plan_replay,
    window_is_cached,
)
from bounded_replay.policy import (
    KEEP_MARGIN_TOKENS,
    ReplayMode,
    ReplayPolicy,
    default_keep_tokens,
    resolve_policy,
)

__all__ = [
    "KEEP_MARGIN_TOKENS",
    "MEASURED_FIDELITY",
    "KVRange",
    "KeepTooSmall",
    "LayerLayout",
    "MeasuredKeep",
    "NoFullAttentionLayer",
    "PlanInputError",
    "ReplayError",
    "ReplayMode",
    "ReplayPlan",
    "ReplayPolicy",
    "ReplayRefused",
    "StoredNamespaces",
    "default_keep_tokens",
    "longest_exact_hit",
    "plan_replay",
    "resolve_policy",
    "stored_namespaces",
    "window_is_cached",
]
