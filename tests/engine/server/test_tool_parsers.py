"""The hermes tool-call parser: whole answers, and streamed answers cut anywhere giving the
same calls and content as the whole."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.server.tool_parsers import HermesStream, parse_hermes

TWO_CALLS = ('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": '
             '"README.md"}}\n</tool_call>\n<tool_call>\n{"name": "ls", "arguments": {}}\n'
             '</tool_call>')


def test_whole_answers() -> None:
    p = parse_hermes(TWO_CALLS)
    assert p.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == [
        ("read_file", {"path": "README.md"}), ("ls", {})]
    assert parse_hermes("no calls here") == parse_hermes("no calls here")
    assert parse_hermes("no calls here").calls == ()
    assert parse_hermes("<tool_call>{not json</tool_call>").calls == ()  # text, not a call
    unclosed = parse_hermes('<tool_call>\n{"name": "ls", "arguments": {"a": 1}}')
    assert [c.name for c in unclosed.calls] == ["ls"] and unclosed.content is None


def streamed(text: str, cuts: list[int], max_calls: int | None = None
             ) -> tuple[str, list[dict]]:
    s = HermesStream(max_calls)
    content, deltas = "", []
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        c, d = s.feed(text[a:b])
        content += c
        deltas += d
    c, d = s.finish()
    return content + c, deltas + d


def merged(deltas: list[dict]) -> list[tuple[str, str, str]]:
    """Deltas accumulated as clients do: by index, arguments concatenated."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
        call["id"] = d.get("id", call["id"])
        call["name"] += d.get("function", {}).get("name", "")
        call["arguments"] += d.get("function", {}).get("arguments", "")
    return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(TWO_CALLS)), max_size=12))
def test_a_stream_cut_anywhere_gives_the_whole_answers_calls(cuts: list[int]) -> None:
    content, deltas = streamed(TWO_CALLS, cuts)
    whole = parse_hermes(TWO_CALLS)
    assert content.strip() == whole.content
    calls = merged(deltas)
    assert [(n, json.loads(a)) for _, n, a in calls] == [
        (c.name, json.loads(c.arguments)) for c in whole.calls]
    assert all(i.startswith("call_") for i, _, _ in calls)
    # The first delta announces the call: its id, type and name.
    assert deltas[0]["type"] == "function" and deltas[0]["function"]["name"] == "read_file"


def test_plain_text_streams_through_and_a_partial_tag_is_held() -> None:
    s = HermesStream()
    assert s.feed("a < b and <tool") == ("a < b and ", [])
    assert s.feed("box") == ("<toolbox", [])
    assert s.finish() == ("", [])


def test_parallel_tool_calls_false_keeps_the_first() -> None:
    _, deltas = streamed(TWO_CALLS, [5, 50], max_calls=1)
    assert [n for _, n, _ in merged(deltas)] == ["read_file"]
