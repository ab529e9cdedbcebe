"""The shapes ``kvengine make-model`` writes, and their ``config.json`` per architecture.

``tiny`` is for tests (float32, seconds to make and run). ``small`` is the demo and bench
model: 8 layers, hidden 512, 8 query and 2 KV heads of 64, bfloat16, so one 64-token block
of KV is 8 × 2 × 64 × 2 × 64 × 2 B = 256 KiB, with a context of 128 K tokens (bounded replay
benches 64 K). ``--hybrid`` alternates sliding (even layers, 128-token window) and full
layers through ``layer_types`` (Qwen2, Qwen3, Gemma 3).

Gemma 3 takes the same shapes with its own habits: ``hidden_activation`` gelu_pytorch_tanh,
a RoPE per layer type (theta 1e6 for full layers, 1e4 for sliding ones, as the released
models), ``query_pre_attn_scalar`` = head_dim, tied embeddings, no soft-caps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EngineInputError
from engine.model.toy_tokenizer import CHATML, GEMMA3, LLAMA3, ChatFormat

HYBRID_WINDOW_TOKENS = 128
# The released Gemma 3s' thetas (rope_theta, rope_local_base_freq), whatever the preset's.
GEMMA_FULL_THETA = 1_000_000.0
GEMMA_SLIDING_THETA = 10_000.0


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the trained tokenizer's size (special tokens included)
    max_context_tokens: int
    dtype: str
    rope_theta: float
    corpus_lines: int  # of generated text the tokenizer is trained on


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4,
                   num_kv_heads=2, head_dim=16, vocab_size=512, max_context_tokens=8192,
                   dtype="float32", rope_theta=10_000.0, corpus_lines=2000),
    "small": Preset("small", num_layers=8, hidden_size=512, intermediate_size=1536,
                    num_heads=8, num_kv_heads=2, head_dim=64, vocab_size=8192,
                    max_context_tokens=131072, dtype="bfloat16", rope_theta=1_000_000.0,
                    corpus_lines=20000),
}


@dataclass(frozen=True, slots=True)
class ArchRecipe:
    """How one ``--arch`` is written: transformers' names and the family's habits."""

    architecture: str
    model_type: str
    chat: ChatFormat
    tie_word_embeddings: bool
    hybrid_ok: bool


ARCHS: dict[str, ArchRecipe] = {
    "llama": ArchRecipe("LlamaForCausalLM", "llama", LLAMA3, tie_word_embeddings=False,
                        hybrid_ok=False),
    "qwen2": ArchRecipe("Qwen2ForCausalLM", "qwen2", CHATML, tie_word_embeddings=True,
                        hybrid_ok=True),
    "qwen3": ArchRecipe("Qwen3ForCausalLM", "qwen3", CHATML, tie_word_embeddings=True,
                        hybrid_ok=True),
    "gemma3": ArchRecipe("Gemma3ForCausalLM", "gemma3_text", GEMMA3, tie_word_embeddings=True,
                         hybrid_ok=True),
}


def layer_windows(preset: Preset, hybrid: bool) -> list[int | None]:
    """Even layers slide when hybrid, so layer 0 slides and the last layer is full."""
    return [HYBRID_WINDOW_TOKENS if hybrid and i % 2 == 0 else None
            for i in range(preset.num_layers)]


def check_hybrid(arch: str, hybrid: bool) -> None:
    if hybrid and not ARCHS[arch].hybrid_ok:
        ok = sorted(a for a, r in ARCHS.items() if r.hybrid_ok)
        raise EngineInputError(f"--hybrid needs --arch {', '.join(ok[:-1])} or {ok[-1]} "
                               f"(layer_types); {arch} has no sliding layers")


def hf_config(arch: str, preset: Preset, hybrid: bool, special_ids: dict[str, int]
              ) -> dict[str, Any]:
    """``config.json`` as transformers writes it for this architecture."""
    check_hybrid(arch, hybrid)
    recipe = ARCHS[arch]
    chat = recipe.chat
    cfg: dict[str, Any] = {
        "architectures": [recipe.architecture],
        "model_type": recipe.model_type,
        "vocab_size": preset.vocab_size,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_layers,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.num_kv_heads,
        "head_dim": preset.head_dim,
        "max_position_embeddings": preset.max_context_tokens,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": preset.rope_theta},
        "tie_word_embeddings": recipe.tie_word_embeddings,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": special_ids.get(chat.bos_token) if chat.bos_token else None,
        "eos_token_id": special_ids[chat.eos_token],
        "pad_token_id": None,
        "dtype": preset.dtype,
    }
    if arch in ("llama", "qwen3", "gemma3"):
        cfg["attention_bias"] = False
    if arch == "llama":
        cfg["mlp_bias"] = False
    windows = layer_windows(preset, hybrid)
    if arch in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = hybrid
        cfg["max_window_layers"] = preset.num_layers
    if arch in ("qwen2", "qwen3", "gemma3"):
        cfg["sliding_window"] = HYBRID_WINDOW_TOKENS if hybrid else None
        cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in windows]
    if arch == "gemma3":
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": GEMMA_FULL_THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA_SLIDING_THETA},
        }
        cfg["query_pre_attn_scalar"] = preset.head_dim
        cfg["final_logit_softcapping"] = None
        cfg["attn_logit_softcapping"] = None
        cfg["use_bidirectional_attention"] = False
    else:
        cfg["hidden_act"] = "silu"
    return cfg


def generation_config(arch: str, special_ids: dict[str, int]) -> dict[str, Any]:
    chat = ARCHS[arch].chat
    out: dict[str, Any] = {"eos_token_id": [special_ids[t] for t in chat.stop_tokens]}
    if chat.bos_token:
        out["bos_token_id"] = special_ids[chat.bos_token]
    return out


def tokenizer_config(arch: str, preset: Preset) -> dict[str, Any]:
    chat = ARCHS[arch].chat
    out: dict[str, Any] = {
        "tokenizer_class": chat.tokenizer_class,
        "bos_token": chat.bos_token,
        "unk_token": None,
        "eos_token": chat.eos_token,
        "pad_token": chat.special_tokens[0] if chat.bos_token is None else chat.eos_token,
        "model_max_length": preset.max_context_tokens,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat.chat_template,
    }
    return out
