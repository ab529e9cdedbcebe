"""``POST /tokenize`` (vLLM's): the ids a completion or chat prompt is served from, which a
router's kv_aware policy hashes to match the replica's KV events."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx

from engine.model.tokenizer import Tokenizer
from tests.engine.server.conftest import MODEL, client, words
from tests.engine.server.serve_process import ServeProcess


def test_tokenize_gives_the_ids_generation_uses(plain: ServeProcess, tiny_dir: Path) -> None:
    prompt = words(12, seed=5)
    got = httpx.post(plain.base_url + "/tokenize", json={"model": MODEL, "prompt": prompt,
                                                          "return_token_strs": True}).json()
    assert got["tokens"] == Tokenizer.from_dir(tiny_dir).encode(prompt)
    assert got["count"] == len(got["tokens"]) and got["max_model_len"] > got["count"]
    done = client(plain).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == got["count"]
    messages = [{"role": "user", "content": prompt}]
    chat = httpx.post(plain.base_url + "/tokenize", json={"messages": messages}).json()
    answer = client(plain).chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                   max_tokens=1)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == chat["count"] > got["count"]  # the template's tokens


def test_tokenize_refuses_bad_bodies(plain: ServeProcess) -> None:
    for body, status in (([1, 2], 400), ({"model": "other", "prompt": "x"}, 404),
                         ({"model": MODEL}, 400)):
        r = httpx.post(plain.base_url + "/tokenize", json=body)
        assert r.status_code == status, (body, r.text)
