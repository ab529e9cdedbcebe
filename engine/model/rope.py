"""Rotary position embeddings: the config's RoPE parameters and the layer that applies them.

Parsing follows transformers' ``RotaryEmbeddingConfigMixin``: a legacy ``rope_scaling`` dict
wins over ``rope_parameters``; ``rope_theta`` comes from that dict, else the top level, else
10000 (Gemma 3's per-layer-type form: ``parse_layer_type_ropes``); the type is ``rope_type``
(or the legacy ``type``), ``default`` when absent. Only ``default``, ``linear`` and ``llama3``
are implemented; anything else is refused by name rather than computed differently. The
frequencies are computed as transformers does (float32 ``inv_freq``, ``cos``/``sin`` of
``position × inv_freq`` cast to the activations' dtype).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.errors import ConfigError, UnsupportedModel
from kernels.fused import torch_apply_rotary

DEFAULT_THETA = 10_000.0
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    rope_type: str  # one of ROPE_TYPES
    theta: float
    factor: float = 1.0  # linear and llama3
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_tokens: int = 0  # llama3

    def as_fields(self) -> list[Any]:
        """A stable, serialisable form (it enters the model revision)."""
        return [self.rope_type, self.theta, self.factor, self.low_freq_factor,
                self.high_freq_factor, self.original_max_position_tokens]


def _number(params: Mapping[str, Any], key: str, where: str) -> float:
    value = params.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"config.json: {where}.{key} must be a positive number, got {value!r}")
    return float(value)


def parse_rope(cfg: Mapping[str, Any], max_position_tokens: int) -> RopeConfig:
    """The RoPE parameters of a ``config.json`` dict."""
    where = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config.json: {where} must be an object, got {params!r}")
    if any(isinstance(v, Mapping) for v in params.values()):
        raise UnsupportedModel(f"config.json: {where} nested per layer type is not supported")
    theta_src = params if "rope_theta" in params else cfg
    theta = (_number(theta_src, "rope_theta", where if theta_src is params else "config")
             if theta_src.get("rope_theta") is not None else DEFAULT_THETA)
    # transformers gives a top-level original_max_position_embeddings priority over the
    # dict's, and falls back to max_position_embeddings.
    original = cfg.get("original_max_position_embeddings")
    if original is None:
        original = params.get("original_max_position_embeddings", max_position_tokens)
    return _typed(params, where, theta, original,
                  params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))


# Gemma3TextConfig's thetas when the config gives none (``default_theta``).
GEMMA_THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
# The legacy top-level key each layer type's theta came from.
_LEGACY_THETA_KEYS = {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}


def parse_layer_type_ropes(cfg: Mapping[str, Any], max_position_tokens: int
                           ) -> dict[str, RopeConfig]:
    """Gemma 3's RoPE per layer type, as ``Gemma3TextConfig.convert_rope_params_to_dict``:
    ``rope_parameters`` keyed by ``full_attention``/``sliding_attention``; a legacy
    ``rope_scaling`` updates the full-attention dict only; a missing theta comes from the
    legacy top-level ``rope_theta`` (full) or ``rope_local_base_freq`` (sliding), else 1e6 /
    1e4. transformers ignores the keys of a flat (unkeyed) ``rope_parameters``; the engine
    refuses them rather than guess which layers they were meant for."""
    given = cfg.get("rope_parameters")
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"config.json: rope_parameters must be an object, got {given!r}")
    flat = sorted(k for k in given if k not in GEMMA_THETAS)
    if flat:
        raise UnsupportedModel(
            f"config.json: rope_parameters must be keyed by layer type (full_attention, "
            f"sliding_attention), got key {flat[0]!r}")
    scaling = cfg.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(f"config.json: rope_scaling must be an object, got {scaling!r}")
    partial = cfg.get("partial_rotary_factor", 1.0)
    out: dict[str, RopeConfig] = {}
    for kind, default_theta in GEMMA_THETAS.items():
        where = f"rope_parameters.{kind}"
        params = given.get(kind)
        if params is None:
            # transformers' default dict names its type, so a legacy rope_scaling that says
            # ``type`` (not ``rope_type``) leaves these layers unscaled there: here too.
            params = {"rope_type": "default"}
        if not isinstance(params, Mapping):
            raise ConfigError(f"config.json: {where} must be an object, got {params!r}")
        params = dict(params)
        if kind == "full_attention" and scaling:
            params.update(scaling)
        if params.get("rope_theta") is None:
            legacy = _LEGACY_THETA_KEYS[kind]
            params["rope_theta"] = (default_theta if cfg.get(legacy) is None
                                    else _number(cfg, legacy, "config"))
        theta = _number(params, "rope_theta", where)
        # Nested dicts take max_position_embeddings, never a top-level original length.
        original = params.get("original_max_position_embeddings", max_position_tokens)
        out[kind] = _typed(params, where, theta, original,
                           params.get("partial_rotary_factor", partial))
    return out


def _typed(params: Mapping[str, Any], where: str, theta: float, original: Any,
           partial: Any) -> RopeConfig:
    """One RoPE dict's type and scaling, its theta and original length already resolved."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModel(
            f"config.json: {where}.rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    if partial not in (None, 1, 1.0):
        raise UnsupportedModel(
            f"config.json: partial_rotary_factor {partial!r} is not supported (only 1.0)"
        )
    if rope_type == "default":
        return RopeConfig("default", theta)
    factor = _number(params, "factor", where)
    if rope_type == "linear":
        return RopeConfig("linear", theta, factor=factor)
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigError(f"config.json: {where}.original_max_position_embeddings must be a "
                          f"positive integer, got {original!r}")
    low = _number(params, "low_freq_factor", where)
    high = _number(params, "high_freq_factor", where)
    if high == low:
        raise ConfigError(f"config.json: {where}.high_freq_factor must differ from "
                          f"low_freq_factor (both {low})")
    return RopeConfig("llama3", theta, factor, low, high, original)


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """float32 ``[head_dim // 2]``, as transformers' ``ROPE_INIT_FUNCTIONS``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        old = rope.original_max_position_tokens
        low_wavelen = old / rope.low_freq_factor
        high_wavelen = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


#: RoPE's rotation, ``x·cos + rotate_half(x)·sin`` (kept in kernels.fused beside its C form).
apply_rotary = torch_apply_rotary


class RotaryEmbedding(nn.Module):
    """``cos``/``sin`` for a step's positions, computed once per step and shared by every
    layer (``apply_rotary`` applies them)."""

    inv_freq: torch.Tensor

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(rope, head_dim), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[tokens, 1, head_dim]`` cos and sin, broadcastable over heads."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

