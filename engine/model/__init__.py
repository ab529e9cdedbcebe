"""Hugging Face decoder checkpoints (Llama, Mistral, Qwen2, Qwen3, Gemma 3) on the paged KV
cache (README.md: the architectures and their switches).

The runner needs ``load_model`` (→ ``LoadedModel``: ``model`` is a ``CausalLM``, ``spec`` a
``ModelSpec``, ``tokenizer`` a ``Tokenizer``); the rest is for tools and tests.
"""

from engine.model.base import CausalLM
from engine.model.config import ModelConfig, load_config, parse_config
from engine.model.loader import LoadedModel, load_model
from engine.model.registry import architecture_names
from engine.model.spec import ModelSpec
from engine.model.tokenizer import Tokenizer

__all__ = [
    "CausalLM",
    "LoadedModel",
    "ModelConfig",
    "ModelSpec",
    "Tokenizer",
    "architecture_names",
    "load_config",
    "load_model",
    "parse_config",
]
