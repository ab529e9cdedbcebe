"""The architectures the engine implements, keyed by ``config.json["architectures"][0]``.

All of them are one decoder (``engine.model.decoder``) with different switches; an entry
says which switches a family uses and which defaults transformers' config class applies
to fields a ``config.json`` leaves out (they differ per family and change the numbers:
Mistral slides over 4096 tokens when ``sliding_window`` is absent, Qwen3's head_dim is
128 unless given, Qwen's KV heads are 32, Gemma 3's activation is ``gelu_pytorch_tanh``).

Gemma 3 is the same decoder with every Gemma switch on: ``(1 + weight)`` RMSNorms, four
norms per layer, embeddings scaled by ``sqrt(hidden_size)``, one RoPE per layer type,
``query_pre_attn_scalar`` as the attention scale and an optional final logit soft-cap.
Each switch is one ``if`` in one module, so a separate Gemma layer class would duplicate
the whole decoder for no gain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from engine.errors import UnsupportedModel


class WindowPolicy(Enum):
    """How a family decides which layers use a sliding window."""

    NONE = "none"  # every layer attends to the whole sequence (Llama)
    ALL_LAYERS = "all_layers"  # ``sliding_window`` applies to every layer when set (Mistral)
    LAYER_TYPES = "layer_types"  # layer_types / use_sliding_window / max_window_layers (Qwen)
    # layer_types, else every ``sliding_window_pattern``-th layer full; ``sliding_window``
    # always applies to the sliding ones (Gemma 3: no use_sliding_window).
    LAYER_PATTERN = "layer_pattern"


class BiasPolicy(Enum):
    """Which projections carry a bias."""

    NONE = "none"
    QKV = "qkv"  # Qwen2: q, k and v always, o never
    FROM_CONFIG = "from_config"  # Llama/Qwen3: ``attention_bias`` (q, k, v, o), ``mlp_bias``
    ATTENTION_FROM_CONFIG = "attention_from_config"  # Gemma 3: ``attention_bias``; MLP never


class NormStyle(Enum):
    """How an RMSNorm applies its weight (both normalise in float32 first)."""

    SCALE = "scale"  # Llama: cast back, then ``weight * x``
    ONE_PLUS = "one_plus"  # Gemma: ``x * (1 + weight)`` in float32, then cast back


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    windows: WindowPolicy
    bias: BiasPolicy
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    # transformers' config-class defaults for fields config.json may omit.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    norm_style: NormStyle = NormStyle.SCALE
    # Gemma 3: post-attention norm on the attention's output, and pre-/post-feedforward
    # norms around the MLP (four per layer instead of two).
    sandwich_norms: bool = False
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    # One RoPE per layer type (``rope_parameters`` keyed by sliding/full_attention, or the
    # legacy ``rope_theta`` + ``rope_local_base_freq``) instead of one for all layers.
    rope_per_layer_type: bool = False
    # Gemma 3: ``query_pre_attn_scalar ** -0.5`` scales attention instead of head_dim's;
    # ``final_logit_softcapping`` and ``attn_logit_softcapping`` are read.
    gemma_fields: bool = False
    activation_key: str = "hidden_act"  # Gemma 3 names it ``hidden_activation``


_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": None,  # None: hidden_size // num_attention_heads
    "num_key_value_heads": None,  # None: num_attention_heads
}


def _defaults(**overrides: Any) -> Mapping[str, Any]:
    return MappingProxyType({**_COMMON, **overrides})


_REGISTRY: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> None:
    """Add (or replace) an architecture; its ``name`` is the ``architectures`` string."""
    _REGISTRY[arch.name] = arch


def architecture_names() -> list[str]:
    return sorted(_REGISTRY)


def get_architecture(name: str) -> Architecture:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedModel(
            f"config.json: architecture {name!r} is not supported "
            f"(supported: {', '.join(architecture_names())})"
        ) from None


register_architecture(Architecture(
    "LlamaForCausalLM", WindowPolicy.NONE, BiasPolicy.FROM_CONFIG, qk_norm=False,
    defaults=_defaults(max_position_embeddings=2048),
))
register_architecture(Architecture(
    "Gemma3ForCausalLM", WindowPolicy.LAYER_PATTERN, BiasPolicy.ATTENTION_FROM_CONFIG,
    qk_norm=True,
    # Gemma3TextConfig's defaults (transformers 5.24), sizes aside.
    defaults=_defaults(hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                       num_key_value_heads=4, head_dim=256, tie_word_embeddings=True,
                       sliding_window=4096, sliding_window_pattern=6, query_pre_attn_scalar=256,
                       final_logit_softcapping=None, attn_logit_softcapping=None,
                       use_bidirectional_attention=False, bos_token_id=2, eos_token_id=1),
    norm_style=NormStyle.ONE_PLUS, sandwich_norms=True, embed_scale=True,
    rope_per_layer_type=True, gemma_fields=True, activation_key="hidden_activation",
))
register_architecture(Architecture(
    "MistralForCausalLM", WindowPolicy.ALL_LAYERS, BiasPolicy.NONE, qk_norm=False,
    defaults=_defaults(max_position_embeddings=4096 * 32, num_key_value_heads=8,
                       sliding_window=4096),
))
register_architecture(Architecture(
    "Qwen2ForCausalLM", WindowPolicy.LAYER_TYPES, BiasPolicy.QKV, qk_norm=False,
    defaults=_defaults(max_position_embeddings=32768, num_key_value_heads=32,
                       use_sliding_window=False, sliding_window=4096, max_window_layers=28),
))
register_architecture(Architecture(
    "Qwen3ForCausalLM", WindowPolicy.LAYER_TYPES, BiasPolicy.FROM_CONFIG, qk_norm=True,
    defaults=_defaults(max_position_embeddings=32768, num_key_value_heads=32,
                       use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                       head_dim=128),
))
