"""Checkpoints written by transformers itself (``save_pretrained`` of random weights), the
reference every model test compares against.

Every parameter is redrawn from a seeded generator (norm weights around 1, biases non-zero)
so that a misplaced tensor changes the output; transformers' own init leaves norms at 1
and biases at 0, which would hide such mistakes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from engine.model.toy_tokenizer import CHATML, train_tokenizer

BASE: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)


@dataclass(frozen=True)
class Case:
    name: str
    config_cls: str  # transformers class names
    model_cls: str
    config: dict[str, Any]
    # Edits to the saved config.json (e.g. legacy keys transformers no longer writes).
    edit: Callable[[dict[str, Any]], None] | None = None
    save: dict[str, Any] = field(default_factory=dict)  # save_pretrained kwargs


def _legacy_linear(cfg: dict[str, Any]) -> None:
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


def _drop_layer_types(cfg: dict[str, Any]) -> None:
    del cfg["layer_types"]  # layers >= max_window_layers slide, computed on load


def _gemma_legacy_rope(cfg: dict[str, Any]) -> None:
    """The form of the released Gemma 3 configs (gemma-3-270m): top-level ``rope_theta`` and
    ``rope_local_base_freq``, a ``rope_scaling`` for the full layers, a
    ``sliding_window_pattern`` instead of ``layer_types``."""
    ropes = cfg.pop("rope_parameters")
    cfg["rope_theta"] = ropes["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = ropes["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    cfg["sliding_window_pattern"] = 3
    del cfg["layer_types"]


def _gemma_270m_form(cfg: dict[str, Any]) -> None:
    """gemma-3-270m's config.json keys: legacy thetas, ``rope_scaling`` null, the
    ``_sliding_window_pattern`` transformers ignores beside explicit ``layer_types``."""
    del cfg["rope_parameters"]
    cfg.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling=None,
               _sliding_window_pattern=6)


# Gemma 3: head_dim and query_pre_attn_scalar apart from hidden_size // heads, one KV head
# as gemma-3-270m, thetas far apart so a swapped RoPE shows.
GEMMA = dict(BASE, head_dim=32, num_key_value_heads=1, query_pre_attn_scalar=24,
             sliding_window=16, rope_parameters={
                 "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})


CASES: dict[str, Case] = {c.name: c for c in [
    Case("llama", "LlamaConfig", "LlamaForCausalLM", dict(BASE)),
    Case("llama_tied_llama3_rope", "LlamaConfig", "LlamaForCausalLM", dict(
        BASE, tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=64))),
    Case("llama_bias_legacy_linear_rope", "LlamaConfig", "LlamaForCausalLM", dict(
        BASE, attention_bias=True, mlp_bias=True), edit=_legacy_linear),
    Case("mistral_window", "MistralConfig", "MistralForCausalLM", dict(
        BASE, sliding_window=8, head_dim=24)),
    Case("qwen2_hybrid", "Qwen2Config", "Qwen2ForCausalLM", dict(
        BASE, num_hidden_layers=4, use_sliding_window=True, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2)),
    Case("qwen2_tied_max_window_layers", "Qwen2Config", "Qwen2ForCausalLM", dict(
        BASE, tie_word_embeddings=True, use_sliding_window=True, sliding_window=11,
        max_window_layers=1), edit=_drop_layer_types),
    Case("qwen3_hybrid_head_dim", "Qwen3Config", "Qwen3ForCausalLM", dict(
        BASE, num_hidden_layers=4, head_dim=32, tie_word_embeddings=True,
        use_sliding_window=True, sliding_window=8,
        layer_types=["full_attention", "sliding_attention"] * 2)),
    Case("qwen3_sharded", "Qwen3Config", "Qwen3ForCausalLM", dict(BASE),
         save=dict(max_shard_size="60KB")),
    Case("gemma3_window", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA, num_hidden_layers=4, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"])),
    Case("gemma3_hybrid_softcap", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA, num_hidden_layers=4, final_logit_softcapping=1.5, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"] * 2)),
    Case("gemma3_hybrid_legacy_rope", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA, num_hidden_layers=3, sliding_window=24, rope_scaling={
            "rope_type": "linear", "factor": 4.0}, sliding_window_pattern=3),
         edit=_gemma_legacy_rope),
    # gemma-3-270m's layer shapes and window (hidden 640, 4 heads and 1 KV head of 256,
    # intermediate 2048, 512-token window, 5 sliding layers then a full one), with fewer
    # layers and a small vocabulary so that prompts past the window stay cheap.
    Case("gemma3_270m_shapes", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        BASE, vocab_size=512, hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, max_position_embeddings=32768), edit=_gemma_270m_form),
]}


def randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    # Gemma's norms scale by 1 + weight: their weights sit around 0, not 1.
    norm_center = 0.0 if "Gemma" in type(model).__name__ else 1.0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(norm_center + 0.1 * noise if name.endswith("norm.weight")
                    else 0.05 * noise)


_TOKENIZER_JSON: list[str] = []


def _tokenizer_json() -> str:
    if not _TOKENIZER_JSON:
        _TOKENIZER_JSON.append(train_tokenizer(CHATML, 256, seed=0, corpus_lines=300).to_str())
    return _TOKENIZER_JSON[0]


def write_case(case: Case, root: Path, seed: int = 0) -> Path:
    """Save ``case`` as transformers does, plus a tokenizer; returns its directory."""
    path = root / case.name
    cfg = getattr(transformers, case.config_cls)(**case.config)
    torch.manual_seed(seed)
    model = getattr(transformers, case.model_cls)(cfg)
    randomize(model, seed)
    model.save_pretrained(path, **case.save)
    (path / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    if case.edit is not None:
        raw = json.loads((path / "config.json").read_text())
        case.edit(raw)
        (path / "config.json").write_text(json.dumps(raw))
    return path


def load_reference(path: Path) -> Any:
    """transformers' model for a checkpoint directory, in float32, eager attention."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()
