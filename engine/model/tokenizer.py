"""A checkpoint's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, the
special tokens of ``tokenizer_config.json`` and its chat template.

Encoding and decoding are the library's (``tokenizer.json`` is authoritative, as in
transformers, which ignores ``add_bos_token``/``add_eos_token`` when that file exists).
The chat template comes from ``chat_template.jinja`` when present (transformers' newer
layout), else ``tokenizer_config.json["chat_template"]`` (a string, or a list of named
templates of which ``default`` is used). A rendered chat is encoded without added special
tokens, as ``apply_chat_template`` does: the template writes them itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from engine.errors import TokenizerError
from engine.model.chat_template import ChatTemplate
from engine.model.config import read_json

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# The named special tokens a chat template sees (transformers' SPECIAL_TOKENS_ATTRIBUTES).
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")


def _token_text(value: Any, key: str) -> str | None:
    """A special token as saved: a string, or an AddedToken object with ``content``."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"{TOKENIZER_CONFIG_FILE}: {key} must be a string, got {value!r}")


def _chat_template_source(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    path = model_dir / CHAT_TEMPLATE_FILE
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: cannot read: {exc}") from None
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
    raise TokenizerError(f"{TOKENIZER_CONFIG_FILE}: chat_template must be a string or a list "
                         f"holding a template named 'default'")


class Tokenizer:
    def __init__(
        self,
        backend: BackendTokenizer,
        special_tokens: Mapping[str, str],
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.chat_template = (None if chat_template is None
                              else ChatTemplate(chat_template, self.special_tokens))

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        path = model_dir / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerError(f"{model_dir}: no {TOKENIZER_FILE} (only tokenizers saved in "
                                 f"the tokenizers library's format are supported)")
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises bare Exceptions for bad files
            raise TokenizerError(f"{path}: not a usable tokenizer: "
                                 f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
        cfg_path = model_dir / TOKENIZER_CONFIG_FILE
        config = read_json(cfg_path) if cfg_path.is_file() else {}
        special = {}
        for key in NAMED_SPECIAL_TOKENS:
            text = _token_text(config.get(key), key)
            if text is not None:
                special[key] = text
        return cls(backend, special, _chat_template_source(model_dir, config))

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer can emit, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def token_id(self, token: str) -> int | None:
        tid = self.backend.token_to_id(token)
        return None if tid is None else int(tid)

    @property
    def bos_token_id(self) -> int | None:
        bos = self.special_tokens.get("bos_token")
        return None if bos is None else self.token_id(bos)

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special_tokens.get("eos_token")
        return None if eos is None else self.token_id(eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The conversation through the chat template (``TokenizerError`` if none)."""
        if self.chat_template is None:
            raise TokenizerError("this checkpoint's tokenizer has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **kwargs)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of ``render_chat``, as ``apply_chat_template(tokenize=True)``."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False)
