"""OpenAI request bodies to engine requests, with every parameter accounted for.

``PARAMETERS`` is the table of every OpenAI parameter of ``/v1/completions`` and
``/v1/chat/completions`` and what the server does with it (the docs print the same table):

- ``honoured``: it does what OpenAI documents;
- ``ignored``: accepted and without effect on the output (``user``, ``metadata``…);
- ``default only``: accepted only at its default (``n`` = 1, ``logprobs`` off, no
  ``tools``…); any other value is a 400 with code ``unsupported_parameter``, never a silent
  misreading. A parameter not in the table is refused the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import EngineInputError
from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults
from engine.sampling_params import SamplingParams
from engine.server.errors import APIError, bad_request, unsupported

Kind = Literal["completion", "chat"]
MAX_STOP_SEQUENCES = 4  # as OpenAI


def _is_default(default: Any) -> Callable[[Any], bool]:
    return lambda v: v is None or v == default


def _no_tools(v: Any) -> bool:
    return v is None or v == [] or v == "none"


@dataclass(frozen=True, slots=True)
class Param:
    policy: Literal["honoured", "ignored", "default only"]
    kinds: tuple[Kind, ...]
    note: str
    accepts: Callable[[Any], bool] | None = None  # default only: the values accepted


BOTH: tuple[Kind, ...] = ("completion", "chat")
PARAMETERS: dict[str, Param] = {
    "model": Param("honoured", BOTH, "must name the served model (`GET /v1/models`)"),
    "prompt": Param("honoured", ("completion",), "text, or a list of token ids"),
    "messages": Param("honoured", ("chat",),
                      "rendered with the checkpoint's chat template; text content only"),
    "max_tokens": Param("honoured", BOTH, "default: the rest of the context, at most 16 "
                        "for completions (as OpenAI)"),
    "max_completion_tokens": Param("honoured", ("chat",), "as `max_tokens`"),
    "temperature": Param("honoured", BOTH, "0 is greedy; default: the checkpoint's "
                         "generation_config.json, else 1"),
    "top_p": Param("honoured", BOTH, "nucleus sampling; default: the checkpoint's "
                   "generation_config.json, else 1"),
    "seed": Param("honoured", BOTH, "a generator per request: same seed, same output"),
    "stop": Param("honoured", BOTH, "up to 4 strings; the text ends before the first"),
    "stream": Param("honoured", BOTH, "server-sent events ending in `data: [DONE]`"),
    "stream_options": Param("honoured", BOTH,
                            "`include_usage`: a last chunk with `usage` and `choices: []`"),
    "cache_salt": Param("honoured", BOTH, "folded into the namespace: requests with "
                        "different salts never share cached KV (as vLLM)"),
    "ignore_eos": Param("honoured", BOTH, "extension (as vLLM): generate `max_tokens` "
                        "tokens whatever the model's end-of-sequence token"),
    "user": Param("ignored", BOTH, "no effect"),
    "metadata": Param("ignored", ("chat",), "no effect"),
    "store": Param("ignored", ("chat",), "nothing is stored for later retrieval"),
    "service_tier": Param("ignored", BOTH, "one tier"),
    "parallel_tool_calls": Param("ignored", ("chat",), "no tools"),
    "n": Param("default only", BOTH, "one choice per request", _is_default(1)),
    "best_of": Param("default only", ("completion",), "one candidate", _is_default(1)),
    "echo": Param("default only", ("completion",), "the prompt is not echoed",
                  _is_default(False)),
    "suffix": Param("default only", ("completion",), "no insertion", _is_default(None)),
    "logprobs": Param("default only", BOTH, "no log probabilities",
                      lambda v: v is None or v is False or v == 0),
    "top_logprobs": Param("default only", ("chat",), "no log probabilities",
                          lambda v: v is None or v == 0),
    "logit_bias": Param("default only", BOTH, "no biasing", lambda v: not v),
    "frequency_penalty": Param("default only", BOTH, "no penalties", _is_default(0)),
    "presence_penalty": Param("default only", BOTH, "no penalties", _is_default(0)),
    "tools": Param("default only", ("chat",), "no tool calling", _no_tools),
    "tool_choice": Param("default only", ("chat",), "no tool calling", _no_tools),
    "functions": Param("default only", ("chat",), "no function calling", _no_tools),
    "function_call": Param("default only", ("chat",), "no function calling", _no_tools),
    "response_format": Param("default only", ("chat",), "plain text only",
                             lambda v: v is None or v == {"type": "text"}),
    "modalities": Param("default only", ("chat",), "text only",
                        lambda v: v is None or v == ["text"]),
    "audio": Param("default only", ("chat",), "text only", _is_default(None)),
    "prediction": Param("default only", ("chat",), "no predicted outputs",
                        _is_default(None)),
    "reasoning_effort": Param("default only", ("chat",), "not a reasoning model",
                              _is_default(None)),
    "web_search_options": Param("default only", ("chat",), "no search", _is_default(None)),
}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_ids: list[int] | None  # completions given token ids
    prompt_text: str | None  # completions given text
    messages: list[dict[str, str]] | None  # chat
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    cache_salt: str | None


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float
            ) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"{name} must be a number", param=name)
    if not lo <= v <= hi:
        raise bad_request(f"{name} must lie in [{lo}, {hi}], got {v}", param=name)
    return float(v)


def _int(body: Mapping[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"{name} must be an integer", param=name)
    return v


def _check_parameters(body: Mapping[str, Any], kind: Kind) -> None:
    for name, value in body.items():
        p = PARAMETERS.get(name)
        if p is None or kind not in p.kinds:
            raise unsupported(name, "not a parameter this server supports")
        if p.policy == "default only" and p.accepts is not None and not p.accepts(value):
            raise unsupported(name, f"only its default is supported ({p.note})")


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > MAX_STOP_SEQUENCES):
        raise bad_request(f"stop must be a non-empty string or a list of at most "
                          f"{MAX_STOP_SEQUENCES} of them", param="stop")
    return tuple(stops)


def _prompt(body: Mapping[str, Any], vocab_size: int) -> tuple[list[int] | None, str | None]:
    v = body.get("prompt")
    if isinstance(v, str):
        return None, v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]  # a batch of one
        if isinstance(v, str):
            return None, v
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in v):
        bad = next((t for t in v if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise bad_request(f"prompt token id {bad} is outside the vocabulary "
                              f"[0, {vocab_size})", param="prompt")
        return list(v), None
    if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
        raise unsupported("prompt", "one prompt per request (a batch of prompts is not "
                          "supported)")
    raise bad_request("prompt must be a string or a non-empty list of token ids",
                      param="prompt")


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    v = body.get("messages")
    if not isinstance(v, list) or not v:
        raise bad_request("messages must be a non-empty list", param="messages")
    out: list[dict[str, str]] = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a role", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise unsupported("messages", f"messages[{i}]: only text content parts")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string", param="messages")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise unsupported("messages", f"messages[{i}]: fields {sorted(extra)} (tool calls "
                              "and audio are not supported)")
        out.append({"role": m["role"], "content": content})
    return out


def parse_request(body: Any, kind: Kind, vocab_size: int,
                  defaults: SamplingDefaults = NO_DEFAULTS) -> GenerationRequest:
    """``defaults``: the checkpoint's generation_config.json values, used for the sampling
    parameters the body leaves out (as vLLM's server does)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_parameters(body, kind)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("model is required", param="model")
    prompt_ids = prompt_text = messages = None
    if kind == "completion":
        prompt_ids, prompt_text = _prompt(body, vocab_size)
    else:
        messages = _messages(body)
    max_tokens = _int(body, "max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request("max_tokens must be >= 1", param="max_tokens")
    if max_tokens is None and kind == "completion":
        max_tokens = 16  # OpenAI's default for completions
    seed = _int(body, "seed")
    stream = body.get("stream") or False
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or set(options) - {"include_usage"}):
        raise unsupported("stream_options", "only include_usage is supported")
    if options is not None and not stream:
        raise bad_request("stream_options needs stream: true", param="stream_options")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("cache_salt must be a string", param="cache_salt")
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(stream, bool) or not isinstance(ignore_eos, bool):
        raise bad_request("stream and ignore_eos must be booleans")
    try:
        params = SamplingParams(
            # None: as many as fit (the engine stops at the context's end).
            max_new_tokens=max_tokens if max_tokens is not None else 1 << 30,
            temperature=_number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0),
            top_p=_number(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0),
            seed=seed,
            ignore_eos=ignore_eos,
        )
    except EngineInputError as e:
        raise bad_request(str(e)) from None
    return GenerationRequest(
        kind=kind, model=model, prompt_ids=prompt_ids, prompt_text=prompt_text,
        messages=messages, params=params, stop=_stop(body), stream=stream,
        include_usage=bool(options and options.get("include_usage")), cache_salt=salt,
    )


def parameter_table() -> str:
    """The Markdown table of ``PARAMETERS`` (the docs hold a copy; a test compares)."""
    rows = ["| parameter | endpoints | what happens |", "|---|---|---|"]
    for name, p in PARAMETERS.items():
        where = "both" if p.kinds == BOTH else ("completions" if p.kinds == ("completion",)
                                                else "chat")
        what = {"honoured": "honoured", "ignored": "accepted, ignored",
                "default only": "400 `unsupported_parameter` unless default"}[p.policy]
        rows.append(f"| `{name}` | {where} | {what}: {p.note} |")
    return "\n".join(rows)


__all__ = ["PARAMETERS", "APIError", "GenerationRequest", "parameter_table", "parse_request"]
