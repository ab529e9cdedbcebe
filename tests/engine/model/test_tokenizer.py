"""Tokenizer and chat template against transformers' ``AutoTokenizer`` on the same files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
from jinja2.exceptions import TemplateError

from engine.model.chat_template import ChatTemplateError
from engine.model.config import load_config
from engine.model.loader import eos_token_ids
from engine.model.make_model import make_model
from engine.model.tokenizer import Tokenizer
from engine.model.toy_tokenizer import corpus

# A template exercising what real ones use: namespace, loop controls, raise_exception,
# tojson (non-ASCII, no HTML escaping, indent), filters, special tokens, the generation
# block, trim_blocks/lstrip_blocks whitespace handling.
TEMPLATE = """\
{%- set ns = namespace(system='') %}
{%- for m in messages %}
    {%- if m['role'] == 'system' %}
        {%- set ns.system = m['content'] %}
        {%- continue %}
    {%- endif %}
    {%- if m['role'] not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception('unknown role ' + m['role']) }}
    {%- endif %}
    {%- if loop.first %}{{ bos_token }}{% endif %}
[{{ m['role'] | upper }}] {% if ns.system and loop.index == 2 %}({{ ns.system }}) {% endif %}
{{- m['content'] | default('') | trim }}
    {%- if m.tool_calls is defined %} calls={{ m['tool_calls'] | tojson }}{% endif %}
{{ eos_token }}
{% endfor %}
{%- if tools %}TOOLS {{ tools | tojson(indent=2) }}
{% endif %}
{%- if add_generation_prompt %}[ASSISTANT] {% generation %}{% endgeneration %}{% endif %}
"""

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": " héllo 日本 "},
     {"role": "assistant", "content": "<b>&amp;</b> ok"}, {"role": "user", "content": "again?"}],
    [{"role": "user", "content": "call it"},
     {"role": "assistant", "content": None,
      "tool_calls": [{"name": "f", "arguments": {"x": "<1> é"}}]},
     {"role": "tool", "content": "42"}],
]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "ünïcode & <tags>"}}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    out = {arch: make_model(arch, "tiny", root / arch).path
           for arch in ("llama", "qwen2", "gemma3")}
    custom = root / "custom"
    make_model("llama", "tiny", custom)
    (custom / "chat_template.jinja").write_text(TEMPLATE)  # wins over tokenizer_config's
    out["custom"] = custom
    return out


def _theirs(path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("which", ["llama", "qwen2", "gemma3", "custom"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_renders_like_transformers(checkpoints: dict[str, Path], which: str,
                                                 chat: int, gen: bool) -> None:
    ours, theirs = Tokenizer.from_dir(checkpoints[which]), _theirs(checkpoints[which])
    messages = CHATS[chat]
    tools = TOOLS if which == "custom" and chat == 2 else None
    try:
        want = theirs.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                          tokenize=False)
    except TemplateError:  # (ChatML reads the content a tool call leaves out)
        with pytest.raises(ChatTemplateError):
            ours.render_chat(messages, add_generation_prompt=gen, tools=tools)
        return
    assert ours.render_chat(messages, add_generation_prompt=gen, tools=tools) == want
    ids = theirs.apply_chat_template(messages, tools=tools, add_generation_prompt=gen)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ours.encode_chat(messages, add_generation_prompt=gen, tools=tools) == list(ids)


def test_template_errors_are_input_errors(checkpoints: dict[str, Path]) -> None:
    bad_role = [{"role": "robot", "content": "beep"}]
    with pytest.raises(TemplateError, match="unknown role robot"):
        _theirs(checkpoints["custom"]).apply_chat_template(bad_role, tokenize=False)
    ours = Tokenizer.from_dir(checkpoints["custom"])
    with pytest.raises(ChatTemplateError, match="unknown role robot"):
        ours.render_chat(bad_role)
    with pytest.raises(ChatTemplateError, match="empty"):
        ours.render_chat([])


def test_template_cannot_reach_python_internals(checkpoints: dict[str, Path]) -> None:
    tok = Tokenizer.from_dir(checkpoints["custom"])
    from engine.model.chat_template import ChatTemplate

    for source in ("{{ messages.__class__.__mro__ }}", "{% set ns = namespace(_x=1) %}",
                   "{{ ''.__class__.__subclasses__() }}"):
        with pytest.raises(ChatTemplateError):
            ChatTemplate(source, tok.special_tokens).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("which", ["llama", "qwen2", "gemma3"])
def test_encode_decode_like_transformers(checkpoints: dict[str, Path], which: str) -> None:
    ours, theirs = Tokenizer.from_dir(checkpoints[which]), _theirs(checkpoints[which])
    texts = [*corpus(11, 200), "12345 67890 x=3.14159", "héllo wörld 日本語 🙂",
             "  two  spaces\n\n\ttab", "<|im_start|>user\nhi<|im_end|>"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)
    assert ours.vocab_size == len(theirs)


def test_chat_template_from_named_list(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "m"
    make_model("qwen2", "tiny", path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                            {"name": "default", "template": "{{ messages[0]['content'] }}!"}]
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    msgs = [{"role": "user", "content": "hey"}]
    assert Tokenizer.from_dir(path).render_chat(msgs) == "hey!"
    assert _theirs(path).apply_chat_template(msgs, tokenize=False) == "hey!"


def test_stop_tokens_follow_generate(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """generation_config.json, else config.json, else the tokenizer's eos_token."""
    path = tmp_path / "m"
    make_model("llama", "tiny", path)
    tok = Tokenizer.from_dir(path)
    ids = {t: tok.token_id(t) for t in ("<|eot_id|>", "<|end_of_text|>")}
    assert eos_token_ids(path, load_config(path), tok) == (ids["<|eot_id|>"],
                                                           ids["<|end_of_text|>"])
    assert list(eos_token_ids(path, load_config(path), tok)) == \
        transformers.GenerationConfig.from_pretrained(path).eos_token_id
    (path / "generation_config.json").unlink()
    assert eos_token_ids(path, load_config(path), tok) == (ids["<|eot_id|>"],)
    raw = json.loads((path / "config.json").read_text())
    raw["eos_token_id"] = None
    (path / "config.json").write_text(json.dumps(raw))
    assert eos_token_ids(path, load_config(path), tok) == (tok.eos_token_id,)
