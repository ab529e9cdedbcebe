"""The sampling parameters of an OpenAI request body, checked one by one, so a value out of
range is a 400 naming its parameter (OpenAI's ranges; vLLM's for its extensions)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.sampling_params import LOGIT_BIAS_LIMIT, MAX_TOP_LOGPROBS
from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults
from engine.server.errors import bad_request

MAX_N = 16  # choices per request: each is a sequence of its own in the batch
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's cap for /v1/completions' logprobs


@dataclass(frozen=True, slots=True)
class SamplingFields:
    """The body's sampling fields, checked; ``logprobs`` is None (none) or the number of
    alternatives per token (0: the chosen token's own only)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: tuple[tuple[int, float], ...]
    stop_token_ids: tuple[int, ...]
    logprobs: int | None
    seed: int | None
    n: int
    echo: bool


def number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float,
           *, open_lo: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"{name} must be a number", param=name)
    if not (lo < v if open_lo else lo <= v) or v > hi:
        raise bad_request(f"{name} must lie in {'(' if open_lo else '['}{lo}, {hi}], got {v}",
                          param=name)
    return float(v)


def integer(body: Mapping[str, Any], name: str, lo: int | None = None,
            hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"{name} must be an integer", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad_request(f"{name} must lie in [{lo}, {hi}], got {v}", param=name)
    return v


def boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{name} must be a boolean", param=name)
    return v


def _token_id(v: Any, name: str, vocab_size: int) -> int:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_size:
        raise bad_request(f"{name}: {v!r} is not a token id of this model [0, {vocab_size})",
                          param=name)
    return v


def _logit_bias(body: Mapping[str, Any], vocab_size: int) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad_request("logit_bias must map token ids to biases", param="logit_bias")
    out = []
    for key, bias in v.items():
        tok = _token_id(key, "logit_bias", vocab_size)
        if (isinstance(bias, bool) or not isinstance(bias, (int, float))
                or not math.isfinite(bias) or abs(bias) > LOGIT_BIAS_LIMIT):
            raise bad_request(f"logit_bias[{key}] must be a number in "
                              f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]",
                              param="logit_bias")
        out.append((tok, float(bias)))
    return tuple(out)


def _stop_token_ids(body: Mapping[str, Any], vocab_size: int) -> tuple[int, ...]:
    v = body.get("stop_token_ids")
    if v is None:
        return ()
    if not isinstance(v, list):
        raise bad_request("stop_token_ids must be a list of token ids", param="stop_token_ids")
    return tuple(_token_id(t, "stop_token_ids", vocab_size) for t in v)


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    if not chat:  # completions: an integer, the alternatives per token
        return integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    on = boolean(body, "logprobs", False)
    top = integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not on:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if on else None


def sampling_fields(body: Mapping[str, Any], chat: bool, vocab_size: int,
                    defaults: SamplingDefaults = NO_DEFAULTS) -> SamplingFields:
    """The body's sampling fields; ``defaults`` (the checkpoint's generation_config.json)
    stand in for those it leaves out, as in vLLM's server, else OpenAI's defaults."""
    top_k = integer(body, "top_k", -1)
    if top_k is None and "top_k" in defaults.as_dict():
        top_k = int(defaults.get("top_k", -1))
    echo = False if chat else boolean(body, "echo", False)
    logprobs = _logprobs(body, chat)
    if echo and logprobs is not None:
        # The prompt's own log probabilities would need a prefill's logits for every
        # prompt token, which the engine does not keep.
        raise bad_request("echo with logprobs is not supported (no prompt logprobs)",
                          param="echo", code="unsupported_parameter")
    return SamplingFields(
        temperature=number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0),
        top_p=number(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0, open_lo=True),
        top_k=0 if top_k is None or top_k == -1 else top_k,
        min_p=number(body, "min_p", defaults.get("min_p", 0.0), 0.0, 1.0),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=number(body, "repetition_penalty",
                                  defaults.get("repetition_penalty", 1.0), 0.0, 2.0,
                                  open_lo=True),
        logit_bias=_logit_bias(body, vocab_size),
        stop_token_ids=_stop_token_ids(body, vocab_size),
        logprobs=logprobs,
        seed=integer(body, "seed"),
        n=integer(body, "n", 1, MAX_N) or 1,
        echo=echo,
    )
