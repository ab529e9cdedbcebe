"""A checkpoint's chat template, rendered as transformers' ``apply_chat_template`` does.

Same environment: jinja2's immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``{% generation %}`` block (rendered as its body),
``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII and does not escape
HTML, a plain ``dict`` and a ``namespace`` that refuses underscore names. Same context:
``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's named
special tokens (``bos_token``, ``eos_token``, …) as strings. Message fields that are
``None`` are dropped first, as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import EngineInputError, TokenizerError


class ChatTemplateError(EngineInputError):
    """The template refused the conversation (``raise_exception``) or failed to render."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks assistant text for training masks;
    rendering only needs its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
            lineno
        )

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace()`` without underscore attributes (no way into CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attributes on a namespace ({name!r})"
            )


class _PlainDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _PlainDict()
    env.globals["namespace"] = _SafeNamespace
    return env


class ChatTemplate:
    """One compiled template plus the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise TokenizerError(f"chat template does not compile: {exc}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The conversation as text, ready to encode without added special tokens."""
        if not messages:
            raise ChatTemplateError("cannot apply the chat template to an empty conversation")
        chat = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise ChatTemplateError(f"chat messages must be objects, got {message!r}")
            chat.append({k: v for k, v in message.items() if v is not None})
        context = {**self.special_tokens, **extra}
        try:
            return self._template.render(
                messages=chat,
                tools=None if tools is None else list(tools),
                documents=None if documents is None else list(documents),
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template: {exc}") from None
