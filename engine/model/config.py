"""``config.json`` → ``ModelConfig``: every number the decoder is built from, validated.

Fields a config leaves out take the defaults of transformers' config class for that family
(``engine.model.registry``); an explicit ``null`` for ``num_key_value_heads`` or
``head_dim`` means "derive it", as the config classes do. A missing size, a bad value or a
setting the engine does not implement is a ``ConfigError``/``UnsupportedModel`` naming the
field.

Sliding windows follow transformers exactly. Qwen2/Qwen3: ``sliding_window`` counts only
when ``use_sliding_window`` is true; ``layer_types`` lists each layer's kind, and when absent
layers ``i >= max_window_layers`` slide. Mistral: a non-null ``sliding_window`` applies to
every layer. Llama ignores windows. transformers masks key ``j`` from query ``i`` unless
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
from engine.model.registry import Architecture, BiasPolicy, WindowPolicy, get_architecture
from engine.model.rope import RopeConfig, parse_rope

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
LAYER_TYPES = ("full_attention", "sliding_attention")


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

    def kv_fields(self) -> list[Any]:
        """Every field that changes the K/V a layer computes (for the model revision)."""
        return [
            self.architecture, self.vocab_size, self.hidden_size, self.intermediate_size,
            self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim,
            self.rms_norm_eps, self.rope.as_fields(), list(self.layer_windows),
            self.qkv_bias, self.o_bias, self.mlp_bias, self.qk_norm, self.tie_word_embeddings,
        ]


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
    act = f.get("hidden_act")
    if act != "silu":
        raise UnsupportedModel(f"config.json: hidden_act {act!r} is not supported (only silu)")
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
        rope=parse_rope(raw, max_pos),
        max_position_tokens=max_pos,
        layer_windows=_windows(f, num_layers),
        qkv_bias=arch.bias is BiasPolicy.QKV or (from_config and f.flag("attention_bias")),
        o_bias=from_config and f.flag("attention_bias"),
        mlp_bias=from_config and f.flag("mlp_bias"),
        qk_norm=arch.qk_norm,
        tie_word_embeddings=f.flag("tie_word_embeddings"),
        dtype=None if dtype_name is None else parse_dtype(dtype_name, "config.json"),
        eos_token_ids=token_ids(raw.get("eos_token_id"), "config.json: eos_token_id"),
        bos_token_id=next(iter(token_ids(raw.get("bos_token_id"), "config.json: bos_token_id")),
                          None),
    )


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
