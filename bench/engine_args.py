"""The command line and model the engine benchmarks share (``bench_engine``,
``bench_replay``): the model (made on first use), the prompt sizes, rounds, new tokens per
request, the per-step token budget, where the SSD tier's directories go, and a JSON copy
of the figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.core.config import EngineConfig


def add_engine_args(
    p: argparse.ArgumentParser,
    *,
    sizes: str,
    rounds: int,
    new_tokens: int,
    sizes_help: str | None = None,
    new_tokens_help: str | None = None,
) -> None:
    p.add_argument("--model", type=Path, default=None, help="default: the make-run model")
    p.add_argument("--sizes", default=sizes, help=sizes_help)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--new-tokens", type=int, default=new_tokens, help=new_tokens_help)
    p.add_argument("--budget", type=int, default=EngineConfig().max_batched_tokens,
                   help="per-step token budget (prefill chunk)")
    p.add_argument("--store-root", type=Path, default=None,
                   help="where the SSD tier's directories go (a real disk, not tmpfs)")
    p.add_argument("--json", type=Path, help="also write the figures here")


def model_and_store_root(args: argparse.Namespace, *, hybrid: bool) -> tuple[Path, Path]:
    """The model directory (``--model``, else the make-run model, made if missing) and the
    store root (``--store-root``, else ``bench-store`` beside the models), created."""
    model_dir = args.model or default_model_dir(hybrid)
    if not (model_dir / "config.json").is_file():
        from engine.model.make_model import make_model

        kind = "small hybrid" if hybrid else "small"
        print(f"making the {kind} model in {model_dir} ...", file=sys.stderr)
        make_model("qwen3", "small", model_dir, hybrid=hybrid, progress=True)
    store_root = args.store_root or model_dir.parent.parent / "bench-store"
    store_root.mkdir(parents=True, exist_ok=True)
    return model_dir, store_root


def default_model_dir(hybrid: bool) -> Path:
    from engine.model.revision import default_cache_dir

    name = "small-qwen3-hybrid" if hybrid else "small-qwen3"
    return default_cache_dir() / "models" / name
