"""``kvengine model-info``: load a checkpoint and print what the engine sees in it.

It runs every check ``load_model`` runs (config, tokenizer, every tensor's name, shape and
dtype), so it doubles as a checkpoint validator: a bad one is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.model.loader import load_model
from engine.model.rope import RopeConfig

KV_BLOCK_TOKENS = 64  # the store's default block


def _rope(rope: RopeConfig | None) -> str | None:
    if rope is None:
        return None
    scaling = "" if rope.rope_type == "default" else f" factor {rope.factor:g}"
    return f"{rope.rope_type} theta {rope.theta:g}{scaling}"


def describe(model_dir: Path, dtype: str | None) -> dict[str, Any]:
    lm = load_model(model_dir, dtype=dtype, progress=True)
    spec, cfg = lm.spec, lm.config
    elem = spec.dtype.itemsize
    return {
        "name": spec.name,
        "model_id": spec.model_id,
        "architecture": spec.architecture,
        "revision": spec.revision,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "heads": spec.num_heads,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_context_tokens": spec.max_context_tokens,
        "layer_windows": list(spec.layer_windows),
        # The numbers that tell the families apart beyond their shapes.
        "rope": _rope(cfg.rope),
        "sliding_rope": _rope(cfg.sliding_rope),  # null: the sliding layers use "rope"
        "activation": cfg.activation,
        "attention_scale": cfg.attention_scale,
        "final_logit_softcap": cfg.final_logit_softcap,
        "eos_token_ids": list(spec.eos_token_ids),
        "chat_template": lm.tokenizer.has_chat_template,
        "kv_bytes_per_block": spec.num_layers * 2 * KV_BLOCK_TOKENS * spec.num_kv_heads
        * spec.head_dim * elem,
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="load as this dtype instead of the checkpoint's")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    info = describe(args.model, args.dtype)
    if args.json:
        print(json.dumps(info))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
    return 0
