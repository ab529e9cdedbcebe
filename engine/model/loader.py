"""``load_model``: a Hugging Face checkpoint directory → model, spec and tokenizer.

The model is built on the meta device (no random initialisation to pay for), given its
dtype, materialised on the target device and filled from the safetensors files; a bad
checkpoint fails before anything is allocated where possible (config, tokenizer and tensor
names and shapes are all checked against what the config implies).

dtype: the caller's override, else the config's ``dtype``/``torch_dtype``, else the
checkpoint's stored dtype (transformers' ``dtype="auto"``). Stop tokens: the
``generation_config.json`` ``eos_token_id`` when present (what transformers' ``generate``
stops on), else ``config.json``'s, else the tokenizer's ``eos_token``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import CheckpointError
from engine.model.catalog import MANIFEST_FILE
from engine.model.config import ModelConfig, parse_config, parse_dtype, read_json, token_ids
from engine.model.decoder import DecoderLM
from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults, sampling_defaults
from engine.model.revision import model_revision
from engine.model.spec import ModelSpec
from engine.model.tokenizer import Tokenizer
from engine.model.weights import checkpoint_files, load_weights, stored_dtype

GENERATION_CONFIG_FILE = "generation_config.json"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: DecoderLM  # a CausalLM
    spec: ModelSpec
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path  # the resolved checkpoint directory
    # generation_config.json's sampling values, for the parameters a request leaves out
    sampling_defaults: SamplingDefaults = NO_DEFAULTS


def eos_token_ids(model_dir: Path, cfg: ModelConfig, tokenizer: Tokenizer) -> tuple[int, ...]:
    gen_path = model_dir / GENERATION_CONFIG_FILE
    if gen_path.is_file():
        gen = read_json(gen_path)
        ids = token_ids(gen.get("eos_token_id"), f"{GENERATION_CONFIG_FILE}: eos_token_id")
        if ids:
            return ids
    if cfg.eos_token_ids:
        return cfg.eos_token_ids
    eos = tokenizer.eos_token_id
    return () if eos is None else (eos,)


def model_name(model_dir: Path, config: Mapping[str, Any]) -> str:
    """The name clients know the model by: the name ``kvengine fetch-model`` installed it
    under, else ``config.json``'s ``_name_or_path`` where that is a hub-style name rather
    than the local path transformers writes when saving a local model, else the directory's
    name."""
    manifest = model_dir / MANIFEST_FILE
    if manifest.is_file():
        name = read_json(manifest).get("name")
        if isinstance(name, str) and name:
            return name
    name = config.get("_name_or_path")
    if isinstance(name, str) and name and not name.startswith(("/", ".", "~")):
        return name
    return model_dir.name


def checkpoint_spec(
    model_dir: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    revision_cache_dir: str | Path | None = None,
    progress: bool = False,
) -> tuple[ModelSpec, ModelConfig, Tokenizer, list[Path], Path]:
    """What ``load_model`` knows of a checkpoint before it reads a tensor: its spec (the
    store namespace's inputs, revision included), config, tokenizer and files. Another
    engine serving the same checkpoint (the vLLM connector) builds the same namespace
    from it without loading the weights."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    path = path.resolve()
    raw = read_json(path / "config.json")
    cfg = parse_config(raw)
    tokenizer = Tokenizer.from_dir(path)
    files = checkpoint_files(path)
    if dtype is not None:
        dt = parse_dtype(dtype, "--dtype")
    elif cfg.dtype is not None:
        dt = cfg.dtype
    else:
        dt = stored_dtype(files, cfg)
        if dt not in (torch.float32, torch.float16, torch.bfloat16):
            dt = torch.float32
    spec = ModelSpec(
        model_id=cfg.architecture,
        name=model_name(path, raw),
        architecture=cfg.architecture,
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        max_context_tokens=cfg.max_position_tokens,
        dtype=dt,
        layer_windows=cfg.layer_windows,
        eos_token_ids=eos_token_ids(path, cfg, tokenizer),
        revision=model_revision(files, cfg, dt, revision_cache_dir, progress),
    )
    return spec, cfg, tokenizer, files, path


def load_model(
    model_dir: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    revision_cache_dir: str | Path | None = None,
    progress: bool = False,
) -> LoadedModel:
    """Load a checkpoint for inference (``CheckpointError`` on anything it cannot serve).

    ``dtype`` overrides the checkpoint's (``"float32"``, ``"bfloat16"``, ``"float16"`` or a
    ``torch.dtype``); ``revision_cache_dir`` holds the cached file digests (default: the
    user's cache directory, see ``engine.model.revision``)."""
    spec, cfg, tokenizer, files, path = checkpoint_spec(
        model_dir, dtype=dtype, revision_cache_dir=revision_cache_dir, progress=progress
    )
    dt = spec.dtype
    dev = torch.device(device)
    with torch.device("meta"):
        model = DecoderLM(cfg, spec)
    model = model.to(dtype=dt).to_empty(device=dev)
    model.init_buffers(dev)
    load_weights(model, cfg, files, progress)
    model.eval()
    return LoadedModel(model=model, spec=spec, tokenizer=tokenizer, config=cfg, path=path,
                       sampling_defaults=sampling_defaults(path))
