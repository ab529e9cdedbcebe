"""Safetensors checkpoints → the decoder's parameters.

A checkpoint is ``model.safetensors`` or the shards named by
``model.safetensors.index.json``. Every tensor name of transformers' layout maps to one
parameter, or to a row range of a fused one (q/k/v → ``qkv_proj``, gate/up →
``gate_up_proj``). Each tensor's shape is checked against that target before it is read; a
tensor the model does not have, a missing one, a wrong shape or a non-float dtype is a
``WeightsError`` naming the tensor and the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.errors import CheckpointError, UnsupportedModel, WeightsError
from engine.model.config import ModelConfig, read_json

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Float storage types safetensors reports, and what they load as.
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "F64": torch.float64}
# Buffers some exporters save that transformers itself recomputes and ignores.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


@dataclass(frozen=True, slots=True)
class Target:
    """Where one checkpoint tensor goes: rows ``[offset, offset + shape[0])`` of ``param``."""

    param: str
    shape: tuple[int, ...]
    offset: int = 0


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: weight_map must be a non-empty object")
        files = sorted({str(v) for v in weight_map.values()})
        paths = [model_dir / name for name in files]
        for p in paths:
            if p.parent != model_dir or not p.is_file():
                raise CheckpointError(f"{index}: shard {p.name!r} is missing")
        return paths
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
        raise UnsupportedModel(f"{model_dir}: only safetensors checkpoints are supported "
                               f"(found PyTorch pickles)")
    raise CheckpointError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}")


def expected_tensors(cfg: ModelConfig) -> dict[str, Target]:
    """transformers' tensor names for ``cfg`` and their targets."""
    hid, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qs, kvs = cfg.num_heads * hd, cfg.num_kv_heads * hd
    out: dict[str, Target] = {
        "model.embed_tokens.weight": Target("model.embed_tokens.weight", (cfg.vocab_size, hid)),
        "model.norm.weight": Target("model.norm.weight", (hid,)),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = Target("lm_head.weight", (cfg.vocab_size, hid))
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if cfg.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        for norm in norms:
            out[f"{src}{norm}.weight"] = Target(f"{dst}{norm}.weight", (hid,))
        qkv = f"{dst}self_attn.qkv_proj"
        for name, offset, rows in (("q", 0, qs), ("k", qs, kvs), ("v", qs + kvs, kvs)):
            out[f"{src}self_attn.{name}_proj.weight"] = Target(f"{qkv}.weight", (rows, hid),
                                                               offset)
            if cfg.qkv_bias:
                out[f"{src}self_attn.{name}_proj.bias"] = Target(f"{qkv}.bias", (rows,), offset)
        out[f"{src}self_attn.o_proj.weight"] = Target(f"{dst}self_attn.o_proj.weight", (hid, qs))
        if cfg.o_bias:
            out[f"{src}self_attn.o_proj.bias"] = Target(f"{dst}self_attn.o_proj.bias", (hid,))
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                out[f"{src}self_attn.{norm}.weight"] = Target(f"{dst}self_attn.{norm}.weight",
                                                              (hd,))
        gu = f"{dst}mlp.gate_up_proj"
        for name, offset in (("gate", 0), ("up", inter)):
            out[f"{src}mlp.{name}_proj.weight"] = Target(f"{gu}.weight", (inter, hid), offset)
            if cfg.mlp_bias:
                out[f"{src}mlp.{name}_proj.bias"] = Target(f"{gu}.bias", (inter,), offset)
        out[f"{src}mlp.down_proj.weight"] = Target(f"{dst}mlp.down_proj.weight", (hid, inter))
        if cfg.mlp_bias:
            out[f"{src}mlp.down_proj.bias"] = Target(f"{dst}mlp.down_proj.bias", (hid,))
    return out


def _ignored(name: str, cfg: ModelConfig) -> bool:
    # With tied embeddings transformers ties lm_head to the embedding and drops a saved one.
    return bool(_IGNORED.search(name)) or (cfg.tie_word_embeddings and name == "lm_head.weight")


def _open(path: Path) -> safe_open:
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path.name}: not a readable safetensors file: {exc}") from None


def _storage_dtype(path: Path, fh: safe_open, name: str) -> torch.dtype:
    kind = fh.get_slice(name).get_dtype()
    if kind not in FLOAT_DTYPES:
        raise WeightsError(f"{path.name}: tensor {name!r} has dtype {kind}, "
                           f"expected a float type ({', '.join(FLOAT_DTYPES)})")
    return FLOAT_DTYPES[kind]


def stored_dtype(files: list[Path], cfg: ModelConfig) -> torch.dtype:
    """The dtype of the checkpoint's embedding (what transformers' ``dtype="auto"`` falls
    back to when the config names none)."""
    for path in files:
        with _open(path) as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                if not _ignored(name, cfg):
                    return _storage_dtype(path, fh, name)
    raise WeightsError(f"{files[0].name}: the checkpoint holds no tensors")


def _tensors(files: list[Path], progress: bool) -> Iterator[tuple[Path, safe_open, str]]:
    for path in tqdm(files, desc="loading weights", unit="file", disable=not progress
                     or len(files) < 2):
        with _open(path) as fh:
            for name in fh.keys():  # noqa: SIM118
                yield path, fh, name


def load_weights(model: torch.nn.Module, cfg: ModelConfig, files: list[Path],
                 progress: bool = False) -> None:
    """Fill every parameter of ``model`` from ``files`` (converting to the parameters'
    dtype), or raise ``WeightsError`` before the model is used."""
    targets = expected_tensors(cfg)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path, fh, name in _tensors(files, progress):
        if _ignored(name, cfg):
            continue
        target = targets.get(name)
        if target is None:
            raise WeightsError(f"{path.name}: unknown tensor {name!r} (not part of a "
                               f"{cfg.architecture} with this config.json)")
        if name in loaded:
            raise WeightsError(f"{path.name}: tensor {name!r} appears twice in the checkpoint")
        shape = tuple(fh.get_slice(name).get_shape())
        if shape != target.shape:
            raise WeightsError(f"{path.name}: tensor {name!r} has shape {list(shape)}, "
                               f"expected {list(target.shape)}")
        _storage_dtype(path, fh, name)
        dst = params[target.param].data
        if target.shape[0] != dst.shape[0]:
            dst = dst.narrow(0, target.offset, target.shape[0])
        dst.copy_(fh.get_tensor(name))
        loaded.add(name)
    missing = [name for name in targets if name not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"missing tensor {missing[0]!r}{more}")
