"""``kvengine make-model``: a random-weight checkpoint in the Hugging Face layout.

Writes ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``
(with a chat template) and ``generation_config.json``, all from ``--seed``: the same
arguments give the same bytes. The directory appears whole or not at all (it is written
beside ``--out`` and renamed into place).
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from engine.errors import EngineInputError, EngineIntegrityError
from engine.model.checkpoint_dir import install, scratch_beside
from engine.model.config import DTYPES, parse_config
from engine.model.presets import (
    ARCHS,
    PRESETS,
    check_hybrid,
    generation_config,
    hf_config,
    tokenizer_config,
)
from engine.model.registry import NormStyle
from engine.model.toy_tokenizer import train_tokenizer
from engine.model.weights import SINGLE_FILE, expected_tensors

INIT_STD = 0.02  # transformers' initializer_range


@dataclass(frozen=True, slots=True)
class MadeModel:
    path: Path
    parameters: int
    kv_bytes_per_block: int  # every layer's K and V of one 64-token block


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def random_tensors(config: dict[str, Any], seed: int, progress: bool = False
                   ) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, in transformers' names, drawn from ``seed``."""
    cfg = parse_config(config)
    dtype = DTYPES[config["dtype"]]
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    targets = expected_tensors(cfg)
    # Scales near 1, not all equal, so a misplaced norm shows; Gemma's norms scale by
    # 1 + weight, so theirs are drawn around 0.
    norm_center = 0.0 if cfg.norm_style is NormStyle.ONE_PLUS else 1.0
    for name, target in tqdm(sorted(targets.items()), desc="random weights", unit="tensor",
                             disable=not progress):
        t = torch.randn(target.shape, generator=gen) * INIT_STD
        if name.endswith("norm.weight"):
            t = norm_center + 5 * t
        out[name] = t.to(dtype).contiguous()
    return out


def make_model(
    arch: str,
    preset_name: str,
    out: Path,
    *,
    hybrid: bool = False,
    seed: int = 0,
    force: bool = False,
    progress: bool = False,
) -> MadeModel:
    if arch not in ARCHS:
        raise EngineInputError(f"--arch {arch!r}: choose one of {', '.join(ARCHS)}")
    if preset_name not in PRESETS:
        raise EngineInputError(f"--preset {preset_name!r}: choose one of {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EngineInputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise EngineInputError(f"--out {out}: directory is not empty (--force replaces it)")
    check_hybrid(arch, hybrid)  # before the seconds spent training the tokenizer
    chat = ARCHS[arch].chat
    tokenizer = train_tokenizer(chat, preset.vocab_size, seed, preset.corpus_lines)
    special_ids: dict[str, int] = {}
    for token in chat.special_tokens:
        tid = tokenizer.token_to_id(token)
        if tid is None:
            raise EngineIntegrityError(f"the trained tokenizer lacks {token!r}")
        special_ids[token] = int(tid)
    config = hf_config(arch, preset, hybrid, special_ids)
    if tokenizer.get_vocab_size() > preset.vocab_size:
        raise EngineIntegrityError("the trained tokenizer outgrew the preset's vocabulary")
    tensors = random_tensors(config, seed, progress)
    cfg = parse_config(config)

    tmp = scratch_beside(out)
    try:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation_config(arch, special_ids))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config(arch, preset))
        tokenizer.save(str(tmp / "tokenizer.json"))
        save_file(tensors, str(tmp / SINGLE_FILE), metadata={"format": "pt"})
        install(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elem = torch.empty((), dtype=DTYPES[config["dtype"]]).element_size()
    return MadeModel(
        path=out,
        parameters=sum(t.numel() for t in tensors.values()),
        kv_bytes_per_block=cfg.num_layers * 2 * 64 * cfg.num_kv_heads * cfg.head_dim * elem,
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", required=True, choices=sorted(ARCHS),
                        help="model family (transformers' Llama, Qwen2, Qwen3 or Gemma 3 "
                             "layout)")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS),
                        help="tiny: tests, float32, seconds; small: 8 layers, hidden 512, "
                             "8/2 heads of 64, bfloat16, 128K context")
    parser.add_argument("--hybrid", action="store_true",
                        help="alternate sliding (128-token window) and full layers "
                             "(qwen2/qwen3/gemma3 only)")
    parser.add_argument("--out", required=True, type=Path, help="directory to create")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and tokenizer")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")


def run(args: argparse.Namespace) -> int:
    made = make_model(args.arch, args.preset, args.out, hybrid=args.hybrid, seed=args.seed,
                      force=args.force, progress=True)
    kind = f"{args.arch} {args.preset}" + (" hybrid" if args.hybrid else "")
    print(f"wrote {made.path}: {kind}, {made.parameters / 1e6:.1f} M parameters, "
          f"{made.kv_bytes_per_block // 1024} KiB of KV per 64-token block")
    return 0
