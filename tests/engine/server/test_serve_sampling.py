"""The sampling and logprob parameters through ``kvengine serve`` with the official client:
``n`` (seeds per choice, siblings served from the first choice's blocks), logprobs in both
shapes, streamed and not, ``logit_bias`` with ``stop_token_ids``, ``echo`` and
``continue_final_message``."""

from __future__ import annotations

import openai

from engine.model.tokenizer import Tokenizer
from tests.engine.server.conftest import BLOCK, MODEL, words
from tests.engine.server.serve_process import ServeProcess


def test_n_choices_keep_their_seeds_and_share_the_prompts_blocks(
        server: ServeProcess, alice: openai.OpenAI) -> None:
    prompt = words(3 * BLOCK, seed=40)
    before = server.metric("kvengine_prompt_tokens_total", 'source="hbm"')
    r = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=6, n=3, seed=21,
                                 temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    hits = server.metric("kvengine_prompt_tokens_total", 'source="hbm"') - before
    prompt_blocks = r.usage.prompt_tokens // BLOCK
    assert hits >= 2 * (prompt_blocks - 1) * BLOCK  # both siblings hit the first's blocks
    total = 0
    for i, c in enumerate(r.choices):  # choice i draws as a lone request seeded seed + i
        alone = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                         seed=21 + i, temperature=1.0)
        assert alone.choices[0].text == c.text
        total += alone.usage.completion_tokens
    assert r.usage.completion_tokens == total  # counted over all choices


def test_chat_logprobs_streamed_and_not(alice: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": words(20, seed=41)}]
    kw = dict(model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True,
              top_logprobs=3, extra_body={"ignore_eos": True})
    r = alice.chat.completions.create(**kw)  # type: ignore[call-overload]
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    for e in content:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].logprob == e.logprob  # greedy: the best token
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    streamed = []
    for chunk in alice.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == \
        [(e.token, round(e.logprob, 4)) for e in content]
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_completion_logprobs_and_echo(alice: openai.OpenAI) -> None:
    prompt = words(15, seed=42)
    r = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                 logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    e = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                 echo=True, extra_body={"ignore_eos": True})
    assert e.choices[0].text == prompt + r.choices[0].text


def test_logit_bias_forces_a_token_and_stop_token_ids_end_on_it(alice: openai.OpenAI,
                                                                tok: Tokenizer) -> None:
    forced = tok.encode(" cache", add_special_tokens=False)[0]
    kw = dict(model=MODEL, prompt=words(10, seed=43), temperature=0,
              logit_bias={str(forced): 100})
    r = alice.completions.create(max_tokens=4, extra_body={"ignore_eos": True}, **kw)
    assert r.choices[0].text == tok.decode([forced] * 4)
    s = alice.completions.create(max_tokens=4, extra_body={"stop_token_ids": [forced]}, **kw)
    assert s.choices[0].text == "" and s.choices[0].finish_reason == "stop"
    assert s.usage.completion_tokens == 1


def test_penalties_and_truncation_are_accepted(alice: openai.OpenAI) -> None:
    r = alice.completions.create(model=MODEL, prompt=words(10, seed=44), max_tokens=8,
                                 temperature=0.8, seed=3, presence_penalty=1.5,
                                 frequency_penalty=1.0, extra_body={
                                     "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_continue_final_message_continues_its_text(alice: openai.OpenAI,
                                                   tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": words(12, seed=45)},
                {"role": "assistant", "content": "The answer is"}]
    r = alice.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "ignore_eos": True})
    text = tok.render_chat(messages, add_generation_prompt=False)
    prompt = text[: text.rindex("The answer is") + len("The answer is")]
    ref = alice.completions.create(model=MODEL, prompt=tok.encode(prompt, False), max_tokens=5,
                                   temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == ref.choices[0].text
    assert r.usage.prompt_tokens == ref.usage.prompt_tokens
