"""What a request constrains its answer to: OpenAI's ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` and its older ``guided_json`` /
``guided_regex`` / ``guided_grammar`` / ``guided_choice``, and ``tool_choice`` ``required``
or a named function (the calls' format with the tools' schemas). One source per request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.server.chat_request import ChatPrompt
from engine.server.errors import bad_request
from engine.structured.spec import ConstraintSpec, json_schema, tool_calls

GUIDED = ("guided_json", "guided_regex", "guided_grammar", "guided_choice")
_OUTPUT_KEYS = {"json": "guided_json", "regex": "guided_regex", "grammar": "guided_grammar",
                "choice": "guided_choice"}


@dataclass(frozen=True, slots=True)
class Constraint:
    spec: ConstraintSpec
    param: str  # the request field it came from (a 400 names it)


def _schema(v: Any, param: str) -> ConstraintSpec:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise bad_request(f"{param} is not a JSON schema", param=param) from None
    if not isinstance(v, (dict, bool)):
        raise bad_request(f"{param} must be a JSON schema", param=param)
    return json_schema(v)


def _guided(kind: str, v: Any, param: str) -> ConstraintSpec:
    if kind == "guided_json":
        return _schema(v, param)
    if kind == "guided_choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
            raise bad_request(f"{param} must be a non-empty list of strings", param=param)
        return ConstraintSpec("lark", "start: " + " | ".join(json.dumps(c) for c in v))
    if not isinstance(v, str) or not v:
        raise bad_request(f"{param} must be a non-empty string", param=param)
    if kind == "guided_regex":
        return ConstraintSpec("regex", v)
    # EBNF: GBNF (llama.cpp's, ``root ::= …``) or Lark (``start: …``), as vLLM accepts.
    return ConstraintSpec("gbnf" if "::=" in v else "lark", v)


def _response_format(v: Any) -> ConstraintSpec | None:
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("response_format.type must be text, json_object or json_schema",
                          param="response_format")
    if v["type"] == "text":
        return None
    if v["type"] == "json_object":
        return json_schema({"type": "object"})
    js = v.get("json_schema")
    if not isinstance(js, dict) or "schema" not in js:
        raise bad_request("response_format.json_schema.schema is required",
                          param="response_format")
    return _schema(js["schema"], "response_format")


def _structured_outputs(v: Any) -> ConstraintSpec | None:
    if not isinstance(v, dict):
        raise bad_request("structured_outputs must be an object", param="structured_outputs")
    if v.get("json_object"):
        v = {**{k: x for k, x in v.items() if k != "json_object"}, "json": {"type": "object"}}
    given = {k: x for k, x in v.items() if x is not None and k != "json_object"}
    unknown = set(given) - set(_OUTPUT_KEYS)
    if unknown or len(given) > 1:
        raise bad_request(f"structured_outputs takes one of {sorted(_OUTPUT_KEYS)} or "
                          f"json_object", param="structured_outputs")
    if not given:
        return None
    ((key, value),) = given.items()
    return _guided(_OUTPUT_KEYS[key], value, "structured_outputs")


def parse_constraint(body: Mapping[str, Any], chat: ChatPrompt | None,
                     parallel_tool_calls: bool) -> Constraint | None:
    found: list[Constraint] = []
    if body.get("response_format") is not None:
        spec = _response_format(body["response_format"])
        if spec is not None:
            found.append(Constraint(spec, "response_format"))
    if body.get("structured_outputs") is not None:
        spec = _structured_outputs(body["structured_outputs"])
        if spec is not None:
            found.append(Constraint(spec, "structured_outputs"))
    found += [Constraint(_guided(k, body[k], k), k) for k in GUIDED if body.get(k) is not None]
    if chat is not None and chat.tool_choice.mode in ("required", "named"):
        fns = [t["function"] for t in chat.tools or ()]
        found.append(Constraint(tool_calls(fns, chat.tool_choice.name,
                                           parallel_tool_calls and chat.tool_choice.name is None),
                                "tool_choice"))
    if len(found) > 1:
        raise bad_request(f"one output constraint per request: {found[0].param} and "
                          f"{found[1].param} both given", param=found[1].param)
    return found[0] if found else None
