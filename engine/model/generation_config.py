"""A checkpoint's ``generation_config.json`` sampling defaults, applied as vLLM applies them.

A model's authors ship the sampling they tuned it for (Gemma: ``top_k`` 64, ``top_p``
0.95…); vLLM's server uses those values for every parameter a request leaves out, and so
does ``kvengine serve`` (temperature, top_p, top_k, min_p, repetition_penalty); a field holding
a value no request could hold is a ``ConfigError`` naming it, as everywhere in
``config.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.model.config import read_json

GENERATION_CONFIG_FILE = "generation_config.json"
# name -> (lowest, highest) a request may ask for (the server's own bounds)
_FIELDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (-1, 1 << 31),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, 2.0),
}


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request gets for the sampling parameters it leaves out: the checkpoint's
    values where it names them, else OpenAI's (``temperature`` 1, ``top_p`` 1)."""

    values: tuple[tuple[str, float], ...] = ()

    def get(self, name: str, fallback: float) -> float:
        return dict(self.values).get(name, fallback)

    def as_dict(self) -> dict[str, float]:
        return dict(self.values)


NO_DEFAULTS = SamplingDefaults()  # a checkpoint without generation_config.json values


def _value(raw: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    v = raw.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise ConfigError(f"{GENERATION_CONFIG_FILE}: {name} must lie in [{lo}, {hi}], "
                          f"got {v!r}")
    return float(v)


def sampling_defaults(model_dir: Path) -> SamplingDefaults:
    path = model_dir / GENERATION_CONFIG_FILE
    if not path.is_file():
        return NO_DEFAULTS
    raw = read_json(path)
    found = ((name, _value(raw, name, lo, hi)) for name, (lo, hi) in _FIELDS.items())
    return SamplingDefaults(tuple((n, v) for n, v in found if v is not None))
