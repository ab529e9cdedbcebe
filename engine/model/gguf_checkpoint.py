"""A GGUF file → a Hugging Face checkpoint directory the engine loads.

Dequantization, the GGUF tensor-name mapping (llama.cpp permutes Llama's q/k rows; Gemma
stores ``norm - 1``…) and the tokenizer's conversion are transformers' GGUF loader's, with
the ``gguf`` package underneath: well-kept code that knows every quantization type, rather
than a dequantizer of our own. transformers refuses to ``save_pretrained`` a model it loaded
from GGUF (its quantizer is not serializable), so the dequantized tensors are copied into a
fresh model of the same config, which saves in the ordinary layout: ``config.json``,
``model.safetensors`` (bfloat16), ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` and ``chat_template.jinja`` where the GGUF has a template.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from engine.errors import EngineInputError

SAVE_DTYPE = torch.bfloat16
EXTRA_HINT = "pip install 'kvstore[models]' (transformers, gguf, accelerate)"


def _transformers() -> Any:
    try:
        # transformers' GGUF loader needs both, and says so only once it has started.
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
        import transformers
    except ImportError as exc:
        raise EngineInputError(f"converting a GGUF file needs {exc.name}: {EXTRA_HINT}") from None
    return transformers


def _drop_quantization(config_path: Path) -> None:
    """The saved ``config.json`` without the GGUF ``quantization_config`` transformers keeps
    on the config (the tensors are plain floats now; the engine refuses quantized configs)."""
    data = json.loads(config_path.read_text(encoding="utf-8"))
    data.pop("quantization_config", None)
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Write the checkpoint of ``gguf_path`` into ``out_dir`` (which must exist, empty);
    returns the model's config as transformers read it from the GGUF metadata."""
    tf = _transformers()
    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers logs a warning per GGUF quirk it handles; the user sees our progress.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                     dtype=torch.float32)
    config = loaded.config
    state = loaded.state_dict()
    fresh = tf.AutoModelForCausalLM.from_config(config, dtype=SAVE_DTYPE)
    fresh.load_state_dict(state, strict=True)  # every tensor, or a RuntimeError naming them
    del loaded, state
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _drop_quantization(out_dir / "config.json")
    return dict(config.to_dict())
