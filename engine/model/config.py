"""``config.json`` → ``ModelConfig``: every number the decoder is built from, validated.

Fields a config leaves out take the defaults of transformers' config class for that family
(``engine.model.registry``); an explicit ``null`` for ``num_key_value_heads`` or
``head_dim`` means "derive it", as the config classes do. A missing size, a bad value or a
setting the engine does not implement is a ``ConfigError``/``UnsupportedModel`` naming the
field.

Sliding windows follow transformers exactly. Qwen2/Qwen3: ``sliding_window`` counts only
when ``use_sliding_window`` is true; ``layer_types`` lists each layer's kind, and when absent
layers ``i >= max_window_layers`` slide. Gemma 3: ``layer_types``, and when absent layer ``i``
is full iff ``(i + 1) % sliding_window_pattern == 0``; ``sliding_window`` always applies to
the sliding ones. Mistral: a non-null ``sliding_window`` applies to every layer. Llama
ignores windows. transformers masks key ``j`` from query ``i`` unless
``j > i − sliding_window`` — the kernels' ``i − j < window`` with ``window = sliding_window``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import ConfigError, UnsupportedModel
from engine.model.registry import (
    Architecture,
    BiasPolicy,
    NormStyle,
    WindowPolicy,
    get_architecture,
)
from engine.model.rope import RopeConfig, parse_layer_type_ropes, parse_rope

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
LAYER_TYPES = ("full_attention", "sliding_attention")
# What transformers' ACT2FN computes for these names: F.silu, F.gelu(approximate="tanh").
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_tokens: int
    layer_windows: tuple[int | None, ...]  # per layer: window in tokens, None = full
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    dtype: torch.dtype | None  # the config's dtype; None when it names none
    eos_token_ids: tuple[int, ...]  # from config.json (generation_config.json wins later)
    bos_token_id: int | None
    # The switches below came with Gemma 3; their defaults are what the families before it
    # compute (``_VARIANT_DEFAULTS``).
    sliding_rope: RopeConfig | None = None  # the sliding layers' RoPE; None: ``rope``
    activation: str = "silu"  # of the gated MLP, one of ACTIVATIONS
    norm_style: NormStyle = NormStyle.SCALE
    sandwich_norms: bool = False  # four norms per layer (Gemma)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    attn_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)

    @property
    def attention_scale(self) -> float:
        return self.head_dim**-0.5 if self.attn_scale is None else self.attn_scale

    def layer_rope(self, layer: int) -> RopeConfig:
        if self.sliding_rope is not None and self.layer_windows[layer] is not None:
            return self.sliding_rope
        return self.rope

    def kv_fields(self) -> list[Any]:
        """Every field that changes the K/V a layer computes (for the model revision).

        The switches added with Gemma 3 enter only where they differ from what the earlier
        families compute, so those families' revisions (and the KV stored under them) stay
        valid. The final logit soft-cap is left out: it changes no K/V."""
        fields: list[Any] = [
            self.architecture, self.vocab_size, self.hidden_size, self.intermediate_size,
            self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim,
            self.rms_norm_eps, self.rope.as_fields(), list(self.layer_windows),
            self.qkv_bias, self.o_bias, self.mlp_bias, self.qk_norm, self.tie_word_embeddings,
        ]
        variant = {
            "sliding_rope": None if self.sliding_rope is None else self.sliding_rope.as_fields(),
            "activation": self.activation,
            "norm_style": self.norm_style.value,
            "sandwich_norms": self.sandwich_norms,
            "embed_scale": self.embed_scale,
            "attn_scale": self.attn_scale,
        }
        changed = [[k, v] for k, v in variant.items() if v != _VARIANT_DEFAULTS[k]]
        if changed:
            fields.append(changed)
        return fields


_VARIANT_DEFAULTS: dict[str, Any] = {
    "sliding_rope": None, "activation": "silu", "norm_style": NormStyle.SCALE.value,
    "sandwich_norms": False, "embed_scale": False, "attn_scale": None,
}


class _Fields:
    """Reads ``config.json`` fields with the family's defaults and one-line errors."""

    def __init__(self, raw: Mapping[str, Any], arch: Architecture) -> None:
        self.raw = raw
        self.arch = arch

    def get(self, key: str) -> Any:
        if key in self.raw:
            return self.raw[key]
        return self.arch.defaults.get(key)

    def has(self, key: str) -> bool:
        return key in self.raw or key in self.arch.defaults

    def positive_int(self, key: str, value: Any = ...) -> int:
        v = self.get(key) if value is ... else value
        if v is None and not self.has(key):
            raise ConfigError(f"config.json: missing field {key!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"config.json: {key} must be a positive integer, got {v!r}")
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise ConfigError(f"config.json: {key} must be true or false, got {v!r}")
        return v


def token_ids(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in items):
        raise ConfigError(f"{key} must be a token id or a list of them, got {value!r}")
    return tuple(dict.fromkeys(items))


def parse_dtype(name: Any, where: str) -> torch.dtype:
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if isinstance(name, str) and name.removeprefix("torch.") in DTYPES:
        return DTYPES[name.removeprefix("torch.")]
    raise UnsupportedModel(f"{where}: dtype {name!r} is not supported "
                           f"(supported: {', '.join(DTYPES)})")


def _windows(f: _Fields, num_layers: int) -> tuple[int | None, ...]:
    policy = f.arch.windows
    if policy is WindowPolicy.NONE:
        return (None,) * num_layers
    window = f.get("sliding_window")
    if policy is WindowPolicy.LAYER_TYPES and not f.flag("use_sliding_window"):
        window = None
    if window is not None:
        window = f.positive_int("sliding_window", window)
    if policy is WindowPolicy.ALL_LAYERS:
        return (window,) * num_layers
    layer_types = f.get("layer_types")
    if layer_types is None and policy is WindowPolicy.LAYER_PATTERN:
        pattern = f.positive_int("sliding_window_pattern")
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                       for i in range(num_layers)]
    if layer_types is None:
        if window is None:
            return (None,) * num_layers
        first = f.get("max_window_layers")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ConfigError(f"config.json: max_window_layers must be a non-negative integer, "
                              f"got {first!r}")
        return tuple(window if i >= first else None for i in range(num_layers))
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ConfigError(f"config.json: layer_types must list {num_layers} layer kinds, "
                          f"got {layer_types!r}")
    for i, kind in enumerate(layer_types):
        if kind not in LAYER_TYPES:
            raise UnsupportedModel(f"config.json: layer_types[{i}] {kind!r} is not supported "
                                   f"(supported: {', '.join(LAYER_TYPES)})")
    if window is None and "sliding_attention" in layer_types:
        # transformers itself cannot build the mask of such a layer.
        raise ConfigError("config.json: layer_types has sliding_attention layers but "
                          "sliding_window is null or use_sliding_window is false")
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)


def parse_config(raw: Mapping[str, Any]) -> ModelConfig:
    """A ``config.json`` dict as a validated ``ModelConfig``."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"config.json: architectures must be a non-empty list of names, "
                          f"got {archs!r}")
    arch = get_architecture(archs[0])
    if raw.get("quantization_config") is not None:
        raise UnsupportedModel("config.json: quantization_config is not supported "
                               "(only unquantized float checkpoints)")
    f = _Fields(raw, arch)
    act = f.get(arch.activation_key)
    if act not in ACTIVATIONS:
        raise UnsupportedModel(f"config.json: {arch.activation_key} {act!r} is not supported "
                               f"(supported: {', '.join(ACTIVATIONS)})")
    hidden = f.positive_int("hidden_size")
    heads = f.positive_int("num_attention_heads")
    num_layers = f.positive_int("num_hidden_layers")
    kv_heads = (heads if f.get("num_key_value_heads") is None
                else f.positive_int("num_key_value_heads"))
    if heads % kv_heads:
        raise ConfigError(f"config.json: num_attention_heads {heads} is not a multiple of "
                          f"num_key_value_heads {kv_heads}")
    if f.get("head_dim") is None:
        if hidden % heads:
            raise ConfigError(f"config.json: hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads} and head_dim is not given")
        head_dim = hidden // heads
    else:
        head_dim = f.positive_int("head_dim")
    if head_dim % 2:
        raise ConfigError(f"config.json: head_dim {head_dim} must be even for RoPE")
    eps = f.get("rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConfigError(f"config.json: rms_norm_eps must be a positive number, got {eps!r}")
    max_pos = f.positive_int("max_position_embeddings")
    dtype_name = raw.get("dtype", raw.get("torch_dtype"))
    from_config = arch.bias is BiasPolicy.FROM_CONFIG
    attn_bias = (from_config or arch.bias is BiasPolicy.ATTENTION_FROM_CONFIG) \
        and f.flag("attention_bias")
    if arch.rope_per_layer_type:
        ropes = parse_layer_type_ropes(raw, max_pos)
        rope, sliding_rope = ropes["full_attention"], ropes["sliding_attention"]
    else:
        rope, sliding_rope = parse_rope(raw, max_pos), None
    attn_scale, softcap = _gemma_fields(f) if arch.gemma_fields else (None, None)
    return ModelConfig(
        architecture=arch.name,
        vocab_size=f.positive_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=f.positive_int("intermediate_size"),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        rope=rope,
        max_position_tokens=max_pos,
        layer_windows=_windows(f, num_layers),
        qkv_bias=arch.bias is BiasPolicy.QKV or attn_bias,
        o_bias=attn_bias,
        mlp_bias=from_config and f.flag("mlp_bias"),
        qk_norm=arch.qk_norm,
        tie_word_embeddings=f.flag("tie_word_embeddings"),
        dtype=None if dtype_name is None else parse_dtype(dtype_name, "config.json"),
        eos_token_ids=token_ids(f.get("eos_token_id"), "config.json: eos_token_id"),
        bos_token_id=next(iter(token_ids(f.get("bos_token_id"), "config.json: bos_token_id")),
                          None),
        sliding_rope=sliding_rope,
        activation=act,
        norm_style=arch.norm_style,
        sandwich_norms=arch.sandwich_norms,
        embed_scale=arch.embed_scale,
        attn_scale=attn_scale,
        final_logit_softcap=softcap,
    )


def _positive_number(f: _Fields, key: str) -> float:
    v = f.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"config.json: {key} must be a positive number, got {v!r}")
    return float(v)


def _gemma_fields(f: _Fields) -> tuple[float, float | None]:
    """Gemma 3's attention scale (``query_pre_attn_scalar ** -0.5``, as transformers
    computes it) and final logit soft-cap; what the engine cannot compute is refused."""
    if f.get("attn_logit_softcapping") is not None:
        # The paged kernels have no soft-cap of attention scores: refused, not ignored.
        raise UnsupportedModel(f"config.json: attn_logit_softcapping "
                               f"{f.get('attn_logit_softcapping')!r} is not supported "
                               f"(only null)")
    if f.flag("use_bidirectional_attention"):
        raise UnsupportedModel("config.json: use_bidirectional_attention true is not "
                               "supported (causal decoders only)")
    scale = _positive_number(f, "query_pre_attn_scalar") ** -0.5
    cap = f.get("final_logit_softcapping")
    return scale, None if cap is None else _positive_number(f, "final_logit_softcapping")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint file, or a ``ConfigError`` naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def load_config(model_dir: Path) -> ModelConfig:
    return parse_config(read_json(model_dir / "config.json"))
