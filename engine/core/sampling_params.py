"""How one request samples and when it stops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineInputError

MAX_TOP_LOGPROBS = 20  # as OpenAI's chat API (vLLM's default cap too)
LOGIT_BIAS_LIMIT = 100.0  # OpenAI: a bias lies in [-100, 100]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise EngineInputError(message)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """``temperature == 0`` is greedy (argmax, no generator). Otherwise the next token is
    drawn from ``softmax(logits / temperature)`` restricted by ``top_k`` (0: off), ``min_p``
    (tokens below ``min_p`` × the top probability dropped) and ``top_p`` (the smallest set
    whose mass reaches it), from a generator seeded with ``seed`` (so a run is reproducible).

    Before either, the logits are adjusted as OpenAI and vLLM define it: ``repetition_penalty``
    (tokens of the prompt or the output: a positive logit divided by it, a negative one
    multiplied), ``frequency_penalty`` × the token's count in the output plus
    ``presence_penalty`` if it occurs there at all (subtracted), ``logit_bias`` (token id,
    bias) pairs added, and the structured-output grammar's mask (``constraint``).

    ``logprobs``: None for none; k ≥ 0 records each sampled token's log probability under
    the model (raw logits) and the k most likely alternatives. ``stop_token_ids`` end the
    request like the end-of-sequence token (even with ``ignore_eos``)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    # A grammar the output must match (engine.structured.ConstraintSpec); hashable.
    constraint: Any = None

    def __post_init__(self) -> None:
        _check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
               f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        _check(_finite(self.temperature) and self.temperature >= 0,
               f"temperature must be >= 0, got {self.temperature!r}")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1,
               f"top_p must lie in (0, 1], got {self.top_p!r}")
        _check(isinstance(self.top_k, int) and self.top_k >= -1,
               f"top_k must be -1 or 0 (off) or >= 1, got {self.top_k!r}")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1,
               f"min_p must lie in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_finite(v) and -2 <= v <= 2, f"{name} must lie in [-2, 2], got {v!r}")
        _check(_finite(self.repetition_penalty) and 0 < self.repetition_penalty <= 2,
               f"repetition_penalty must lie in (0, 2], got {self.repetition_penalty!r}")
        for tok, bias in self.logit_bias:
            _check(isinstance(tok, int) and tok >= 0 and _finite(bias)
                   and abs(bias) <= LOGIT_BIAS_LIMIT,
                   f"logit_bias: token {tok!r} with bias {bias!r} (a bias lies in "
                   f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}])")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               f"stop_token_ids must be token ids, got {self.stop_token_ids!r}")
        _check(self.logprobs is None or (isinstance(self.logprobs, int)
                                         and 0 <= self.logprobs <= MAX_TOP_LOGPROBS),
               f"logprobs must lie in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def truncates(self) -> bool:
        """Whether sampling keeps only part of the vocabulary (top-k, top-p)."""
        return self.top_k > 0 or self.top_p < 1
