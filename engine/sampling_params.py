"""How one request samples and when it stops."""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import EngineInputError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """``temperature == 0`` is greedy (argmax, no generator). Otherwise nucleus sampling
    over ``softmax(logits / temperature)`` restricted to the smallest set of tokens whose
    probability reaches ``top_p``, drawn from a generator seeded with ``seed`` (so a run is
    reproducible)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise EngineInputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise EngineInputError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise EngineInputError(f"top_p must lie in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
