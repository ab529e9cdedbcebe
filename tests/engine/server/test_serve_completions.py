"""``kvengine serve`` completions and chat against the official ``openai`` client, the tiny
model at temperature 0: streamed and not, usage (cached tokens) in streams, a second turn
served from cache, tenants and salts kept apart, seeds and stop strings."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx2 as httpx
import openai

from engine.model.tokenizer import Tokenizer
from tests.engine.server.conftest import BLOCK, MODEL, cached, client, prefix_hit, words
from tests.engine.server.serve_process import ServeProcess


def test_models_and_health(server: ServeProcess, alice: openai.OpenAI) -> None:
    assert [m.id for m in alice.models.list()] == [MODEL]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}


def test_completion_of_text_and_of_its_token_ids_agree(alice: openai.OpenAI,
                                                      tiny_dir: Path) -> None:
    prompt = words(40, seed=1)
    # ignore_eos: the random-weight model may sample an end token, so without it either
    # finish reason could come; with it, and no stop strings, only the length can end it.
    a = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert a.choices[0].finish_reason == "length" and a.usage is not None
    assert a.usage.completion_tokens == 8
    ids = Tokenizer.from_dir(tiny_dir).encode(prompt)  # the server's tokenizer, read here
    b = alice.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                 extra_body={"cache_salt": "ids", "ignore_eos": True})
    assert b.usage is not None and b.usage.prompt_tokens == a.usage.prompt_tokens == len(ids)
    assert (b.usage.completion_tokens, b.choices[0].finish_reason) == (8, "length")
    assert b.choices[0].text == a.choices[0].text


def test_streamed_chat_equals_unstreamed_and_reports_usage(alice: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": words(30, seed=2)}]
    whole = alice.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                          temperature=0, extra_body={"cache_salt": "w"})
    chunks = list(alice.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache_salt": "s"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    # A streamed completion without include_usage carries no usage chunk.
    plain_chunks = list(alice.completions.create(model=MODEL, prompt=words(10), max_tokens=4,
                                                 temperature=0, stream=True))
    assert all(c.usage is None and c.choices for c in plain_chunks)


def test_second_turn_is_cached_and_says_what_an_uncached_server_says(
        alice: openai.OpenAI, plain: ServeProcess, tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": words(150, seed=3)},
                {"role": "user", "content": words(20, seed=4)}]
    first = alice.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          temperature=0)
    assert first.usage is not None and cached(first.usage) == 0
    p1 = tok.encode_chat(messages)
    assert first.usage.prompt_tokens == len(p1)
    # The first turn left in the pool its prompt's whole blocks and any block its answer's
    # computed tokens (all but the last of at most 8) complete: none here, so what the
    # answer's text re-tokenises to in the second prompt cannot change the hit.
    assert (len(p1) + 7) // BLOCK == len(p1) // BLOCK
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": words(15, seed=5)}]
    second = alice.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True})
    chunks = list(second)
    usage = chunks[-1].usage
    p2 = tok.encode_chat(messages)
    assert usage is not None and usage.prompt_tokens == len(p2)
    # The template renders the first turn's prompt as the second's prefix (the answer's
    # header ends both), so every whole block of the first prompt is a hit.
    assert cached(usage) == prefix_hit(p2, p1) == len(p1) // BLOCK * BLOCK
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ref = client(plain).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0,
        extra_body={"cache_salt": uuid.uuid4().hex})  # a salt nobody used: nothing cached
    assert ref.usage is not None and cached(ref.usage) == 0
    assert ref.usage.prompt_tokens == usage.prompt_tokens
    assert text == ref.choices[0].message.content


def test_tenants_and_salts_never_share_hits(alice: openai.OpenAI, bob: openai.OpenAI,
                                            tok: Tokenizer) -> None:
    prompt = words(120, seed=6)
    ids = tok.encode(prompt)
    hit = prefix_hit(ids, ids)  # the prompt's whole blocks, short of its last token
    assert hit > 0

    def ask(c: openai.OpenAI, **extra: str) -> int:
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                 extra_body=extra or None)
        assert r.usage is not None
        return cached(r.usage)

    assert ask(alice) == 0
    assert ask(alice) == hit
    assert ask(bob) == 0
    assert ask(alice, cache_salt="x") == 0
    assert ask(alice, cache_salt="x") == hit


def test_seed_reproduces_a_sampled_answer(alice: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        r = alice.completions.create(model=MODEL, prompt=words(12, seed=7), max_tokens=12,
                                     temperature=1.0, top_p=0.9, seed=seed)
        return r.choices[0].text

    assert sample(11) == sample(11)


def test_stop_string_ends_the_text_before_it(alice: openai.OpenAI) -> None:
    prompt = words(25, seed=8)
    full = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                    extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) >= 4
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = full.index(stop)
    for stream in (False, True):
        if stream:
            chunks = list(alice.completions.create(
                model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop],
                stream=True, extra_body={"ignore_eos": True}))
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                         temperature=0, stop=stop,
                                         extra_body={"ignore_eos": True})
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == full[:cut] and reason == "stop"
