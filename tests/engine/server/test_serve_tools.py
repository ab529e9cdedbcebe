"""Tool calling and structured outputs through ``kvengine serve`` with the official client,
on the tiny random model: ``tool_choice`` required or named makes the grammar write the
calls, ``auto`` parses what a regex made the model write; streamed calls equal unstreamed
ones; a tool loop's history re-tokenizes to the same prefix, so each turn's cached tokens
cover the last turn's prompt and answer; JSON schemas are obeyed over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.engine.server.conftest import BLOCK, MODEL, client, words
from tests.engine.server.serve_process import REPO, ServeProcess

TEMPLATE = REPO / "examples" / "tool_chat_template_hermes.jinja"
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository",
    "parameters": {"type": "object", "properties": {
        "path": {"enum": ["README.md", "pyproject.toml", "engine/server/README.md"]}},
        "required": ["path"], "additionalProperties": False}}}
LIST_DIR = {"type": "function", "function": {
    "name": "list_dir", "parameters": {"type": "object", "properties": {
        "dir": {"type": "string", "maxLength": 8, "pattern": "^[a-z/]*$"}},
        "required": ["dir"], "additionalProperties": False}}}
TOOLS = [READ_FILE, LIST_DIR]


@pytest.fixture(scope="module")
def tools_server(tiny_dir: Path, env: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    store = tmp_path_factory.mktemp("tools-store")
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", f"embedded:{store}",
                       "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE),
                       "--pool-tokens", "8192"], env) as s:
        yield s


@pytest.fixture
def oai(tools_server: ServeProcess) -> openai.OpenAI:
    return client(tools_server)


def ask(oai: openai.OpenAI, messages: list, **kw: object) -> object:
    kw = {"max_tokens": 200, "temperature": 0.7, "seed": 5, **kw}
    return oai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       **kw)  # type: ignore[call-overload]


def test_required_and_named_tool_choice_give_valid_calls(oai: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": words(12, seed=50)}]
    r = ask(oai, messages, tool_choice="required", parallel_tool_calls=False)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.id.startswith("call_")
    assert call.function.name in ("read_file", "list_dir")
    assert isinstance(json.loads(call.function.arguments), dict)
    named = ask(oai, messages, tool_choice={"type": "function",
                                            "function": {"name": "read_file"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments)["path"] in READ_FILE["function"][
        "parameters"]["properties"]["path"]["enum"]


def test_streamed_tool_calls_equal_unstreamed(oai: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": words(9, seed=51)}]
    kw = dict(tool_choice={"type": "function", "function": {"name": "list_dir"}})
    whole = ask(oai, messages, **kw).choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in ask(oai, messages, stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = d.id or c["id"]
            if d.function is not None:
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == whole.function.name == "list_dir"
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.function.arguments)
    assert calls[0]["id"].startswith("call_")


def test_auto_parses_the_calls_the_model_writes(oai: openai.OpenAI) -> None:
    text = 'Let me read it.\n<tool_call>\n{"name": "read_file", "arguments": ' \
           '{"path": "README.md"}}\n</tool_call>'
    regex = text.replace(".", r"\.").replace("{", r"\{").replace("}", r"\}")
    messages = [{"role": "user", "content": "read the readme"}]
    r = ask(oai, messages, extra_body={"structured_outputs": {"regex": regex}})
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content == "Let me read it."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == \
        [("read_file", {"path": "README.md"})]
    none = ask(oai, messages, tool_choice="none",
               extra_body={"structured_outputs": {"regex": regex}})
    assert none.choices[0].message.content == text and not none.choices[0].message.tool_calls


def test_a_tool_loop_hits_the_cache_turn_after_turn(oai: openai.OpenAI) -> None:
    messages: list[dict] = [{"role": "system", "content": words(60, seed=52)},
                            {"role": "user", "content": "look around"}]
    last = None
    for turn in range(5):
        r = ask(oai, messages, tool_choice="required", parallel_tool_calls=False,
                seed=turn)
        if last is not None:  # the previous prompt and answer, in whole blocks
            computed = last.prompt_tokens + last.completion_tokens - 1  # not the last token
            assert r.usage.prompt_tokens_details.cached_tokens >= computed // BLOCK * BLOCK
        last = r.usage
        (call,) = r.choices[0].message.tool_calls
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": words(30, seed=60 + turn)})


def test_json_schema_response_format(oai: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {
        "answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0,
                                                   "maximum": 9}},
        "required": ["answer", "score"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "well?"}], max_tokens=50,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    out = json.loads(r.choices[0].message.content)
    assert out["answer"] in ("yes", "no") and 0 <= out["score"] <= 9
    c = oai.completions.create(model=MODEL, prompt="pick", max_tokens=10,
                               extra_body={"guided_choice": ["alpha", "beta"]})
    assert c.choices[0].text in ("alpha", "beta")


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectz"}}}}, "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
])
def test_bad_constraints_are_400_naming_the_parameter(oai: openai.OpenAI, extra: dict,
                                                      param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=1, extra_body=extra,
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.param == param
