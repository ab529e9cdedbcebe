"""Tool calls in a model's text, chosen by ``--tool-call-parser`` (as vLLM's).

``hermes``: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks, as Hermes,
Qwen and SmolLM3 templates teach; text before the first block is the message's content.
Streamed, a call is announced (``id``, ``type``, ``function.name``, empty ``arguments``)
as soon as its name is complete, and its arguments follow in one delta when its block
closes: the OpenAI stream's shape, which clients accumulate by concatenation. Text that
only might be the start of a tag is held back until it is or is not one."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

PARSERS = ("hermes",)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the API carries it

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Parsed:
    content: str | None
    calls: tuple[ToolCall, ...]


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(block: str, call_id: str | None = None) -> ToolCall | None:
    """One block's JSON as a call, or None when it is not one."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(call_id or _call_id(), obj["name"], text)


def parse_hermes(text: str) -> Parsed:
    """The whole answer: its calls, or (any block not a call) all of it as content."""
    first = text.find(OPEN)
    if first < 0:
        return Parsed(text, ())
    calls = []
    at = first
    while at >= 0:
        end = text.find(CLOSE, at)
        block = text[at + len(OPEN) : end if end >= 0 else len(text)]
        call = _call(block.strip())
        if call is None:
            return Parsed(text, ())
        calls.append(call)
        at = -1 if end < 0 else text.find(OPEN, end)
    content = text[:first].strip()
    return Parsed(content or None, tuple(calls))


def _partial_tag(text: str) -> int:
    """Characters at the end of ``text`` that could begin ``OPEN``."""
    for k in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0


@dataclass
class HermesStream:
    """Turns text deltas into content deltas and tool-call deltas (``feed``, ``finish``);
    each returns ``(content, tool_call_deltas)``."""

    max_calls: int | None = None  # parallel_tool_calls false: 1
    calls: list[ToolCall] = field(default_factory=list)
    _buf: str = ""
    _in_call: bool = False
    _announced: str | None = None  # the id of the open call, once its name was sent
    _seen_call: bool = False

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        self._buf += delta
        content, deltas = "", []
        while True:
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _partial_tag(self._buf)
                    out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(
                        self._buf) - keep :]
                    content += self._content(out)
                    return content, deltas
                content += self._content(self._buf[:at])
                self._buf = self._buf[at + len(OPEN) :]
                self._in_call = True
                self._seen_call = True
            end = self._buf.find(CLOSE)
            if end < 0:
                deltas += self._announce(self._buf)
                return content, deltas
            block, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
            self._in_call = False
            deltas += self._close(block)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left once no more text comes: an unclosed block is a call if it parses."""
        if self._in_call:
            block, self._buf, self._in_call = self._buf, "", False
            before = len(self.calls)
            deltas = self._close(block)
            if len(self.calls) == before and self._announced is None:
                return OPEN + block, deltas
            return "", deltas
        out, self._buf = self._buf, ""
        return self._content(out), []

    def _content(self, text: str) -> str:
        # Text between or after calls is the template's spacing, not an answer.
        return text if not self._seen_call else ""

    def _limited(self) -> bool:
        return self.max_calls is not None and len(self.calls) >= self.max_calls

    def _announce(self, block: str) -> list[dict[str, Any]]:
        """The open call's header, once ``block`` (its text so far) holds its name."""
        if self._announced is not None or self._limited():
            return []
        m = _NAME.search(block)
        if m is None:
            return []
        self._announced = _call_id()
        name = json.loads(f'"{m.group(1)}"')
        return [{"index": len(self.calls), "id": self._announced, "type": "function",
                 "function": {"name": name, "arguments": ""}}]

    def _close(self, block: str) -> list[dict[str, Any]]:
        if self._limited():
            return []
        head = self._announce(block)
        call = _call(block.strip(), self._announced)
        self._announced = None
        if call is None:  # not a call after all: nothing more for it (its header stays)
            return head
        index = len(self.calls)
        self.calls.append(call)
        if head:  # announced just now: one delta with everything
            head[0]["function"]["arguments"] = call.arguments
            return head
        return [{"index": index, "function": {"arguments": call.arguments}}]
