"""OpenAI request bodies to engine requests, with every parameter accounted for.

``PARAMETERS`` is the table of every OpenAI parameter of ``/v1/completions`` and
``/v1/chat/completions`` and what the server does with it (the docs print the same table):

- ``honoured``: it does what OpenAI documents;
- ``ignored``: accepted and without effect on the output (``user``, ``metadata``…);
- ``default only``: accepted only at its default (``best_of`` = 1, no ``suffix``…);
  any other value is a 400 with code ``unsupported_parameter``, never a silent
  misreading. A parameter not in the table is refused the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine.core.sampling_params import SamplingParams
from engine.errors import EngineInputError
from engine.model.generation_config import NO_DEFAULTS, SamplingDefaults
from engine.server.chat_request import ChatPrompt, parse_chat
from engine.server.errors import APIError, bad_request, unsupported
from engine.server.kv_transfer import KVTransfer, parse_kv_transfer
from engine.server.request_sampling import boolean, integer, sampling_fields
from engine.server.structured_request import parse_constraint

log = logging.getLogger("engine.server")
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
                      "rendered with the checkpoint's chat template (or `--chat-template`); "
                      "text content, assistant `tool_calls` and `tool` messages"),
    "max_tokens": Param("honoured", BOTH, "default: the rest of the context "
                        "(`--max-model-len`, else the model's), at most 16 for completions (as "
                        "OpenAI). Never reserved up front: a request is admitted on what its "
                        "prompt needs and takes blocks as it decodes; an answer that outgrows "
                        "the whole pool stops there with `finish_reason` `length`"),
    "max_completion_tokens": Param("honoured", ("chat",), "as `max_tokens`"),
    "temperature": Param("honoured", BOTH, "0 is greedy; in [0, 2]; default: the "
                         "checkpoint's generation_config.json, else 1"),
    "top_p": Param("honoured", BOTH, "nucleus sampling; in (0, 1]; default: "
                   "generation_config.json, else 1"),
    "top_k": Param("honoured", BOTH, "extension (as vLLM): the k most likely tokens; "
                   "-1 or 0 is off"),
    "min_p": Param("honoured", BOTH, "extension (as vLLM): drop tokens below `min_p` "
                   "times the top probability; in [0, 1]"),
    "presence_penalty": Param("honoured", BOTH, "subtracted once from the logit of every "
                              "token of the output; in [-2, 2]"),
    "frequency_penalty": Param("honoured", BOTH, "subtracted per occurrence in the output; "
                               "in [-2, 2]"),
    "repetition_penalty": Param("honoured", BOTH, "extension (as vLLM): tokens of the "
                                "prompt or output: positive logits divided, negative "
                                "multiplied; in (0, 2]"),
    "logit_bias": Param("honoured", BOTH, "token id to a bias in [-100, 100], added to "
                        "the logit"),
    "seed": Param("honoured", BOTH, "a generator per choice: same seed, same output "
                  "(choice i draws from `seed + i`)"),
    "stop": Param("honoured", BOTH, "up to 4 strings; the text ends before the first"),
    "stop_token_ids": Param("honoured", BOTH, "extension (as vLLM): token ids that end "
                            "the answer (left out of its text)"),
    "n": Param("honoured", BOTH, "up to 16 choices; the others start once the first has "
               "prefilled, so they share its prompt's blocks in the pool"),
    "logprobs": Param("honoured", BOTH, "chat: `true` for each token's log probability; "
                      "completions: 0-5 alternatives per token. The model's own "
                      "distribution (raw logits), before penalties and temperature"),
    "top_logprobs": Param("honoured", ("chat",), "0-20 alternatives per token (needs "
                          "`logprobs`)"),
    "echo": Param("honoured", ("completion",), "the prompt's text before the answer; "
                  "not with `logprobs` (400)"),
    "stream": Param("honoured", BOTH, "server-sent events ending in `data: [DONE]`"),
    "stream_options": Param("honoured", BOTH,
                            "`include_usage`: a last chunk with `usage` and `choices: []`"),
    "cache_salt": Param("honoured", BOTH, "folded into the namespace: requests with "
                        "different salts never share cached KV (as vLLM)"),
    "ignore_eos": Param("honoured", BOTH, "extension (as vLLM): generate `max_tokens` "
                        "tokens whatever the model's end-of-sequence token"),
    "tools": Param("honoured", ("chat",), "rendered through the chat template's `tools`; "
                   "calls parsed by `--tool-call-parser`"),
    "tool_choice": Param("honoured", ("chat",), "`auto` (needs `--tool-call-parser`), "
                         "`none` (nothing parsed), `required` and a named function (the "
                         "grammar forces hermes calls matching the tools' schemas)"),
    "parallel_tool_calls": Param("honoured", ("chat",), "`false`: only the first call is "
                                 "returned"),
    "chat_template_kwargs": Param("honoured", ("chat",), "extension (as vLLM): more "
                                  "variables for the chat template"),
    "add_generation_prompt": Param("honoured", ("chat",), "extension (as vLLM): default "
                                   "`true`"),
    "continue_final_message": Param("honoured", ("chat",), "extension (as vLLM): the "
                                    "answer continues the last message (its text is the "
                                    "prompt's end); excludes `add_generation_prompt`"),
    "response_format": Param("honoured", ("chat",), "`json_object`, `json_schema` (its "
                             "`schema`; `strict` or not, the answer always matches): the "
                             "grammar masks the logits (llguidance); JSON written with "
                             "`json.dumps`'s separators"),
    "structured_outputs": Param("honoured", BOTH, "extension (as vLLM): one of `json`, "
                                "`regex`, `choice`, `grammar` (GBNF or Lark), "
                                "`json_object`"),
    "guided_json": Param("honoured", BOTH, "extension (vLLM's older form): a JSON schema"),
    "guided_regex": Param("honoured", BOTH, "extension (vLLM's older form): a regex"),
    "guided_grammar": Param("honoured", BOTH, "extension (vLLM's older form): a GBNF "
                            "(`root ::= …`) or Lark (`start: …`) grammar"),
    "guided_choice": Param("honoured", BOTH, "extension (vLLM's older form): one of the "
                           "strings"),
    "kv_transfer_params": Param("honoured", BOTH, "extension (as vLLM's PD mode): "
                                "`do_remote_decode` (a `--kv-role prefill` replica commits the "
                                "prompt's blocks to the store before it answers, and returns "
                                "the params for the decode replica), `do_remote_prefill` (a "
                                "`--kv-role decode` replica waits for those blocks and loads "
                                "them); other fields ignored"),
    "user": Param("ignored", BOTH, "no effect"),
    "metadata": Param("ignored", ("chat",), "no effect"),
    "store": Param("ignored", ("chat",), "nothing is stored for later retrieval"),
    "service_tier": Param("ignored", BOTH, "one tier"),
    "best_of": Param("default only", ("completion",), "one candidate", _is_default(1)),
    "suffix": Param("default only", ("completion",), "no insertion", _is_default(None)),
    "functions": Param("default only", ("chat",), "deprecated: use `tools`", _no_tools),
    "function_call": Param("default only", ("chat",), "deprecated: use `tool_choice`",
                           _no_tools),
    "modalities": Param("default only", ("chat",), "text only",
                        lambda v: v is None or v == ["text"]),
    "audio": Param("default only", ("chat",), "text only", _is_default(None)),
    "prediction": Param("default only", ("chat",), "no predicted outputs",
                        _is_default(None)),
    "reasoning_effort": Param("default only", ("chat",), "not a reasoning model",
                              _is_default(None)),
    "web_search_options": Param("default only", ("chat",), "no search", _is_default(None)),
    # vLLM's own extras, which routers (vllm-router, sglang-router) add to every request
    # at their defaults: accepted there, refused where their effect would be dropped.
    "no_stop_trim": Param("default only", BOTH, "vLLM extra: stop strings are always "
                          "trimmed from the text", _is_default(False)),
    "skip_special_tokens": Param("default only", BOTH, "vLLM extra: special tokens are "
                                 "always left out of the text", _is_default(True)),
    "spaces_between_special_tokens": Param("default only", BOTH, "vLLM extra: text as the "
                                           "tokenizer decodes it", _is_default(True)),
    "return_hidden_states": Param("default only", BOTH, "vLLM extra: no hidden states",
                                  _is_default(False)),
    "min_tokens": Param("default only", BOTH, "vLLM extra: no floor on the answer's length "
                        "(end-of-sequence and stop tokens end it at once); on a prefill "
                        "request (`kv_transfer_params.do_remote_decode`), to which vllm-router "
                        "adds `min_tokens: 1`, it is ignored: that request's one token is "
                        "discarded, only its KV is used", _is_default(0)),
    "separate_reasoning": Param("ignored", ("chat",), "router extra: the served models "
                                "write no reasoning section to separate"),
    "stream_reasoning": Param("ignored", ("chat",), "router extra: no reasoning section"),
    "include_reasoning": Param("ignored", ("chat",), "router extra: no reasoning section"),
}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_ids: list[int] | None  # completions given token ids
    prompt_text: str | None  # completions given text
    chat: ChatPrompt | None
    params: SamplingParams  # choice 0's; choice i's seed is ``seed + i``
    n: int
    echo: bool
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    cache_salt: str | None
    parallel_tool_calls: bool = True
    constraint_param: str | None = None  # where params.constraint came from
    kv_transfer: KVTransfer | None = None  # prefill/decode hand-off (engine.server.kv_transfer)

    def choice_params(self, index: int) -> SamplingParams:
        p = self.params
        return p if index == 0 or p.seed is None else replace(p, seed=p.seed + index)


def _check_parameters(body: Mapping[str, Any], kind: Kind) -> None:
    for name, value in body.items():
        p = PARAMETERS.get(name)
        if p is None or kind not in p.kinds:
            raise unsupported(name, "not a parameter this server supports")
        if p.policy == "ignored":
            log.debug("%s=%r ignored: %s", name, value, p.note)
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


def parse_request(body: Any, kind: Kind, vocab_size: int,
                  defaults: SamplingDefaults = NO_DEFAULTS) -> GenerationRequest:
    """``defaults``: the checkpoint's generation_config.json values, used for the sampling
    parameters the body leaves out (as vLLM's server does)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    kv_transfer = parse_kv_transfer(body.get("kv_transfer_params"))
    if kv_transfer is not None and kv_transfer.remote_decode and "min_tokens" in body:
        # The router's prefill request: its answer is thrown away, only its KV is used.
        log.debug("min_tokens=%r ignored on a prefill request", body["min_tokens"])
        body = {k: v for k, v in body.items() if k != "min_tokens"}
    _check_parameters(body, kind)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("model is required", param="model")
    prompt_ids = prompt_text = chat = None
    if kind == "completion":
        prompt_ids, prompt_text = _prompt(body, vocab_size)
    else:
        chat = parse_chat(body)
    max_tokens = integer(body, "max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = integer(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request("max_tokens must be >= 1", param="max_tokens")
    if max_tokens is None and kind == "completion":
        max_tokens = 16  # OpenAI's default for completions
    stream = boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or set(options) - {"include_usage"}):
        raise unsupported("stream_options", "only include_usage is supported")
    if options is not None and not stream:
        raise bad_request("stream_options needs stream: true", param="stream_options")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("cache_salt must be a string", param="cache_salt")
    f = sampling_fields(body, kind == "chat", vocab_size, defaults)
    parallel = boolean(body, "parallel_tool_calls", True)
    constraint = parse_constraint(body, chat, parallel)
    try:
        params = SamplingParams(
            # None: as many as fit (the engine stops at the context's end).
            max_new_tokens=max_tokens if max_tokens is not None else 1 << 30,
            temperature=f.temperature, top_p=f.top_p, top_k=f.top_k, min_p=f.min_p,
            presence_penalty=f.presence_penalty, frequency_penalty=f.frequency_penalty,
            repetition_penalty=f.repetition_penalty, logit_bias=f.logit_bias,
            stop_token_ids=f.stop_token_ids, logprobs=f.logprobs, seed=f.seed,
            ignore_eos=boolean(body, "ignore_eos", False),
            constraint=None if constraint is None else constraint.spec,
        )
    except EngineInputError as e:
        raise bad_request(str(e)) from None
    return GenerationRequest(
        kind=kind, model=model, prompt_ids=prompt_ids, prompt_text=prompt_text, chat=chat,
        params=params, n=f.n, echo=f.echo, stop=_stop(body), stream=stream,
        include_usage=bool(options and options.get("include_usage")), cache_salt=salt,
        parallel_tool_calls=parallel,
        constraint_param=None if constraint is None else constraint.param,
        kv_transfer=kv_transfer,
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
