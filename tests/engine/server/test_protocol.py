"""The server's pure parts: the parameter table and its docs, request parsing, streamed
text with stop strings, the tenant rule, listen addresses."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import EngineInputError
from engine.server.cli import is_loopback, parse_listen
from engine.server.errors import APIError
from engine.server.protocol import PARAMETERS, parameter_table, parse_request
from engine.server.tenants import namespace_tenant
from engine.server.text_stream import TextStream

REPO = Path(__file__).resolve().parents[3]


def test_the_docs_hold_the_parameter_table() -> None:
    assert parameter_table() in (REPO / "engine" / "server" / "README.md").read_text()


def test_every_default_only_parameter_accepts_its_absence_and_refuses_a_value() -> None:
    for name, p in PARAMETERS.items():
        if p.policy != "default only":
            continue
        assert p.accepts is not None and p.accepts(None), name
        assert not p.accepts({"x": 1}) or name == "logit_bias", name


def parse(**body: object) -> object:
    return parse_request({"model": "m", "prompt": "x", **body}, "completion", vocab_size=100)


@pytest.mark.parametrize("body,code", [
    ({"n": 17}, "invalid_value"),
    ({"best_of": 2}, "unsupported_parameter"),
    ({"top_k": -2}, "invalid_value"),
    ({"min_p": 1.5}, "invalid_value"),
    ({"presence_penalty": 2.5}, "invalid_value"),
    ({"frequency_penalty": -3}, "invalid_value"),
    ({"repetition_penalty": 0}, "invalid_value"),
    ({"logit_bias": {"5": 101}}, "invalid_value"),
    ({"logit_bias": {"100": 1}}, "invalid_value"),  # outside the vocabulary
    ({"stop_token_ids": [100]}, "invalid_value"),
    ({"logprobs": 6}, "invalid_value"),
    ({"echo": True, "logprobs": 1}, "unsupported_parameter"),
    ({"whatever": 1}, "unsupported_parameter"),
    ({"messages": []}, "unsupported_parameter"),  # a chat parameter on completions
    ({"prompt": ["a", "b"]}, "unsupported_parameter"),
    ({"prompt": [5, 100]}, "invalid_value"),
    ({"prompt": []}, "invalid_value"),
    ({"temperature": "hot"}, "invalid_value"),
    ({"top_p": 0}, "invalid_value"),
    ({"stop": ["a"] * 5}, "invalid_value"),
    ({"stream_options": {"include_usage": True}}, "invalid_value"),  # without stream
    ({"seed": 1.5}, "invalid_value"),
])
def test_bad_bodies_are_400(body: dict, code: str) -> None:
    with pytest.raises(APIError) as e:
        parse(**body)
    assert e.value.status == 400 and e.value.code == code
    assert e.value.param == next(iter(body))  # the error names the parameter


def test_sampling_parameters_reach_the_engine() -> None:
    r = parse(top_k=5, min_p=0.1, presence_penalty=0.5, frequency_penalty=-0.5,
              repetition_penalty=1.2, logit_bias={"7": -100, 9: 3}, stop_token_ids=[4],
              logprobs=2, n=3, seed=10)
    p = r.params
    assert (p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty) == (5, 0.1, 0.5, -0.5)
    assert p.repetition_penalty == 1.2 and p.logit_bias == ((7, -100.0), (9, 3.0))
    assert p.stop_token_ids == (4,) and p.logprobs == 2 and r.n == 3 and parse(echo=True).echo
    assert [r.choice_params(i).seed for i in range(3)] == [10, 11, 12]
    assert parse(top_k=-1).params.top_k == 0


def chat(**body: object) -> object:
    return parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}],
                          **body}, "chat", vocab_size=100)


TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def test_chat_logprobs_tools_and_template_options() -> None:
    assert chat(logprobs=True, top_logprobs=3).params.logprobs == 3
    assert chat(logprobs=True).params.logprobs == 0 and chat().params.logprobs is None
    r = chat(tools=[TOOL], chat_template_kwargs={"enable_thinking": False},
             messages=[{"role": "user", "content": "read it"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "c1", "type": "function", "function": {
                               "name": "read_file", "arguments": '{"path": "a"}'}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "text"},
                       {"role": "assistant", "content": "It says"}],
             continue_final_message=True, add_generation_prompt=False)
    c = r.chat
    assert c.tool_choice.mode == "auto" and c.tools[0]["function"]["name"] == "read_file"
    assert c.messages[1]["tool_calls"][0]["function"]["arguments"] == {"path": "a"}
    assert c.continue_final_message and not c.add_generation_prompt
    assert c.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("body,param", [
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"continue_final_message": True, "add_generation_prompt": True},
     "continue_final_message"),
    ({"tool_choice": "auto", "tools": [{"type": "function"}]}, "tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [TOOL]},
     "tool_choice"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),  # no tool_call_id
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]},
     "messages"),
])
def test_bad_chat_bodies_name_their_parameter(body: dict, param: str) -> None:
    with pytest.raises(APIError) as e:
        chat(**body)
    assert e.value.status == 400 and e.value.param == param


def test_a_good_body_becomes_engine_parameters() -> None:
    r = parse(max_tokens=5, temperature=0, seed=3, stop="\n", stream=True,
              stream_options={"include_usage": True}, cache_salt="s", user="u", n=1)
    assert r.params.max_new_tokens == 5 and r.params.greedy and r.params.seed == 3
    assert r.stop == ("\n",) and r.stream and r.include_usage and r.cache_salt == "s"
    assert parse().params.max_new_tokens == 16  # OpenAI's completions default
    assert parse(prompt=[[1, 2, 3]]).prompt_ids == [1, 2, 3]  # a batch of one


class CharTokenizer:
    """Token i is chr(i); 0xFF pairs make a two-token character (decoded as U+FFFD
    until its second half arrives)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out, i = [], 0
        while i < len(ids):
            if ids[i] == 0xFF:
                out.append("\ufffd" if i + 1 == len(ids) else chr(0x4E00 + ids[i + 1]))
                i += 2
            else:
                out.append(chr(ids[i]))
                i += 1
        return "".join(out)


letters = st.lists(st.integers(ord("a"), ord("e")), max_size=30)


@given(letters, st.lists(st.text("abcde", min_size=1, max_size=3), max_size=3),
       st.lists(st.integers(1, 4), min_size=1, max_size=30))
def test_streamed_text_is_the_whole_text_cut_at_the_first_stop(
        ids: list[int], stops: list[str], splits: list[int]) -> None:
    full = "".join(map(chr, ids))
    cuts = [i for s in stops if (i := full.find(s)) >= 0]
    expected = full[: min(cuts)] if cuts else full
    ts = TextStream(CharTokenizer(), stops)
    sent, pos = "", 0
    for n in splits * 30:
        if pos >= len(ids) or ts.stopped:
            break
        sent += ts.add(ids[pos : pos + n])
        pos += n
        # Never a character past a stop string, nor a stop string's beginning.
        assert expected.startswith(sent)
    sent += ts.finish()
    assert sent == expected and ts.stopped == bool(cuts)


def test_a_cut_character_is_held_back() -> None:
    ts = TextStream(CharTokenizer())
    assert ts.add([ord("a"), 0xFF]) == "a"
    assert ts.add([1]) == chr(0x4E01)


def test_namespace_tenant_rule() -> None:
    assert namespace_tenant("", "alice") == "alice"
    assert namespace_tenant("engine-1/*", "alice") == "engine-1/alice"
    with pytest.raises(EngineInputError, match="delegating token"):
        namespace_tenant("engine-1", "alice")


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:8000") == ("::1", 8000)
    for bad in ("8000", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(EngineInputError):
            parse_listen(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.org")
