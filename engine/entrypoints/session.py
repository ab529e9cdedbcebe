"""Multi-turn sessions: the session file and how each turn's token ids are built.

A session file holds one JSON object per line, ``{"user": "..."}``, optionally with
``"session": NAME`` so that several conversations (agents) interleave in one file; a line
without it belongs to the conversation ``""``. Each turn of a conversation is the previous
turn's prompt ids, then its generated ids, then the new user text encoded, through the chat
template when the checkpoint has one. Nothing is decoded and re-encoded, so the previous
answer's blocks are the same chain and hit on the next turn.

With a chat template, the new text is the template's rendering of the conversation after
the last assistant message: the template is rendered with a placeholder as that message's
content and the text after the placeholder is what the turn appends (the closing of the
assistant message, the new user message, the generation prompt). If the model generated the
end-of-turn token itself, its text is not appended a second time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.errors import EngineInputError
from kvstore.textfile import read_text

_PLACEHOLDER = "\x00kvengine-answer\x00"


class ChatTokenizer(Protocol):
    """What a session needs of a checkpoint's tokenizer (``engine.model.tokenizer``)."""

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def render_chat(self, messages: list[dict[str, Any]],
                    add_generation_prompt: bool = True) -> str: ...


@dataclass(frozen=True, slots=True)
class SessionTurn:
    session: str
    user: str


def read_session_file(path: str | Path) -> list[SessionTurn]:
    """Parse a session file; a bad line is one error naming the file and line."""
    turns: list[SessionTurn] = []
    lines = read_text(path, "--session-file").splitlines()  # names the file
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise EngineInputError(f"{path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("user"), str):
            raise EngineInputError(f'{path}:{n}: expected {{"user": "..."}}')
        unknown = set(obj) - {"user", "session"}
        if unknown:
            raise EngineInputError(f"{path}:{n}: unknown keys {sorted(unknown)}")
        name = obj.get("session", "")
        if not isinstance(name, str):
            raise EngineInputError(f"{path}:{n}: session must be a string")
        turns.append(SessionTurn(session=name, user=obj["user"]))
    if not turns:
        raise EngineInputError(f"session file {path} holds no turns")
    return turns


@dataclass
class Conversation:
    """One conversation's token ids so far and the messages they render."""

    tokenizer: ChatTokenizer
    eos_token_ids: tuple[int, ...] = ()
    ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    _answer_ids: list[int] = field(default_factory=list)

    def next_prompt(self, user: str) -> list[int]:
        """This turn's prompt ids (the history plus the new user text)."""
        self.ids = self.ids + self._answer_ids + self._encode_turn(user)
        self.messages.append({"role": "user", "content": user})
        self._answer_ids = []
        return list(self.ids)

    def record_answer(self, output_ids: list[int]) -> str:
        """Keep the generated ids for the next turn; returns the answer's text."""
        self._answer_ids = list(output_ids)
        text = self.tokenizer.decode(list(output_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def _encode_turn(self, user: str) -> list[int]:
        tok = self.tokenizer
        if not tok.has_chat_template:
            return tok.encode(user, add_special_tokens=not self.ids)
        new = {"role": "user", "content": user}
        if not self.messages:
            return tok.encode(tok.render_chat([new], True), add_special_tokens=False)
        before = self.messages[:-1]
        head = tok.render_chat(before, True)
        text = tok.render_chat([*before, {"role": "assistant", "content": _PLACEHOLDER}, new],
                               True)
        at = text.find(_PLACEHOLDER)
        if at != len(head) or not text.startswith(head):
            # A template that rewrites history: the best we can do without re-encoding it.
            return tok.encode(user, add_special_tokens=False)
        tail = text[at + len(_PLACEHOLDER) :]
        if self._answer_ids and self._answer_ids[-1] in self.eos_token_ids:
            eos_text = tok.decode([self._answer_ids[-1]], skip_special_tokens=False)
            tail = tail.removeprefix(eos_text)
        return tok.encode(tail, add_special_tokens=False)
