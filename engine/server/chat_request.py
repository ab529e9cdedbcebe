"""A chat request's conversation and how it becomes a prompt: messages (tool calls and tool
results included), ``tools`` and ``tool_choice``, and the chat template's own options
(``chat_template_kwargs``, ``add_generation_prompt``, ``continue_final_message``).

Assistant tool calls reach the template with their ``arguments`` as an object, not the JSON
string the API carries (as vLLM does): templates write them with ``tojson``, and a string
would be quoted twice, so the history a tool loop re-sends would not re-tokenize to what
the model produced."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.errors import EngineInputError
from engine.model.tokenizer import Tokenizer
from engine.server.errors import bad_request, unsupported
from engine.server.request_sampling import boolean

# Names the template's context already binds: chat_template_kwargs may not replace them.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto``: the model decides, the parser finds calls; ``none``: no calls parsed;
    ``required``: at least one call; ``named``: a call of ``name``."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    messages: tuple[Mapping[str, Any], ...]  # as the template sees them
    tools: tuple[Mapping[str, Any], ...] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def tool(self, name: str) -> Mapping[str, Any] | None:
        return next((t["function"] for t in self.tools or () if t["function"]["name"] == name),
                    None)


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise unsupported("messages", f"{where}: only text content parts")
        return "".join(p["text"] for p in content)
    raise bad_request(f"{where}.content must be a string", param="messages")


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
            or call.get("type", "function") != "function"):
        raise bad_request(f"{where} must be a function call with a name", param="messages")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise bad_request(f"{where}.function.arguments is not JSON",
                              param="messages") from None
    out: dict[str, Any] = {"type": "function",
                           "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise bad_request(f"{where} must be an object with a role", param="messages")
    role = m["role"]
    extra = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"}
    if extra:
        raise unsupported("messages", f"{where}: fields {sorted(extra)}")
    out: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise bad_request(f"{where}: tool_calls belong to assistant messages as a list",
                              param="messages")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]")
                             for j, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise bad_request(f"{where}: a tool message needs tool_call_id", param="messages")
        out["tool_call_id"] = m["tool_call_id"]
    if out["content"] is None and not calls:
        raise bad_request(f"{where}.content must be a string", param="messages")
    return out


def _tools(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...] | None:
    v = body.get("tools")
    if v is None or v == []:
        return None
    if not isinstance(v, list):
        raise bad_request("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(v):
        fn = t.get("function") if isinstance(t, dict) else None
        if (not isinstance(fn, dict) or t.get("type") != "function"
                or not isinstance(fn.get("name"), str) or not fn["name"]):
            raise bad_request(f"tools[{i}] must be a function with a name", param="tools")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema",
                              param="tools")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return tuple(out)


def _tool_choice(body: Mapping[str, Any], tools: tuple[dict[str, Any], ...] | None
                 ) -> ToolChoice:
    v = body.get("tool_choice")
    if v is None:
        return ToolChoice("auto" if tools else "none")
    if v in ("auto", "none", "required"):
        choice = ToolChoice(v)
    elif (isinstance(v, dict) and v.get("type") == "function"
          and isinstance(v.get("function"), dict) and isinstance(v["function"].get("name"), str)):
        choice = ToolChoice("named", v["function"]["name"])
    else:
        raise bad_request("tool_choice must be auto, none, required or a named function",
                          param="tool_choice")
    if choice.mode in ("required", "named") and not tools:
        raise bad_request(f"tool_choice {choice.mode} needs tools", param="tool_choice")
    if choice.name is not None and not any(t["function"]["name"] == choice.name
                                           for t in tools or ()):
        raise bad_request(f"tool_choice names {choice.name!r}, which is not in tools",
                          param="tool_choice")
    return choice


def parse_chat(body: Mapping[str, Any]) -> ChatPrompt:
    v = body.get("messages")
    if not isinstance(v, list) or not v:
        raise bad_request("messages must be a non-empty list", param="messages")
    messages = tuple(_message(m, i) for i, m in enumerate(v))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or _RESERVED & set(kwargs):
        raise bad_request(f"chat_template_kwargs must be an object not naming "
                          f"{sorted(_RESERVED)}", param="chat_template_kwargs")
    cont = boolean(body, "continue_final_message", False)
    gen = boolean(body, "add_generation_prompt", not cont)
    if cont and gen:
        raise bad_request("continue_final_message and add_generation_prompt exclude each "
                          "other", param="continue_final_message")
    if cont and messages[-1]["content"] is None:
        raise bad_request("continue_final_message needs a last message with content",
                          param="continue_final_message")
    tools = _tools(body)
    return ChatPrompt(messages=messages, tools=tools, tool_choice=_tool_choice(body, tools),
                      template_kwargs=kwargs, add_generation_prompt=gen,
                      continue_final_message=cont)


def render_chat(tok: Tokenizer, chat: ChatPrompt) -> list[int]:
    """The prompt's token ids: the template's text, cut after the last message's content
    when the model is to continue it (as transformers' ``continue_final_message``)."""
    if not tok.has_chat_template:
        raise bad_request("this model has no chat template: use /v1/completions",
                          param="messages")
    try:
        text = tok.render_chat(list(chat.messages),
                               add_generation_prompt=chat.add_generation_prompt,
                               tools=None if chat.tools is None else list(chat.tools),
                               **chat.template_kwargs)
    except EngineInputError as e:
        raise bad_request(f"the chat template failed: {e}", param="messages") from None
    if chat.continue_final_message:
        final = str(chat.messages[-1]["content"]).strip()
        at = text.rfind(final)
        if not final or at < 0:
            raise bad_request("the chat template does not write the last message's content "
                              "as given: it cannot be continued",
                              param="continue_final_message")
        text = text[: at + len(final)]
    return tok.encode(text, add_special_tokens=False)
