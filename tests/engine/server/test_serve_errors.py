"""``kvengine serve`` refusing what it must: missing or wrong keys (401), malformed or
out-of-range requests (400 with the OpenAI error body), unsupported parameters, and bad
command lines (one line, before it serves)."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from tests.engine.server.conftest import MODEL, TOKENS, client
from tests.engine.server.serve_process import ServeProcess


def test_missing_or_wrong_key_is_401(server: ServeProcess) -> None:
    for key in ("none", "c" * 40):
        with pytest.raises(openai.AuthenticationError) as e:
            client(server, key).completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    r = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_bad_requests_are_400_with_the_openai_body(server: ServeProcess,
                                                    alice: openai.OpenAI) -> None:
    r = httpx.post(server.base_url + "/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    cases = [
        dict(prompt="x " * 9000),  # over the 8192-token context
        dict(prompt="x", temperature=5),
        dict(prompt="x", max_tokens=0),
        dict(prompt=[10 ** 9]),  # a token id outside the vocabulary
        dict(prompt="x", max_tokens=10 ** 6),
    ]
    for case in cases:
        with pytest.raises(openai.BadRequestError) as e:
            alice.completions.create(model=MODEL, **case)  # type: ignore[call-overload]
        assert e.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        alice.completions.create(model="gpt-4", prompt="x", max_tokens=1)


@pytest.mark.parametrize("extra", [
    {"best_of": 3}, {"suffix": "z"}, {"made_up_parameter": 1}, {"echo": True, "logprobs": 1},
])
def test_unsupported_parameters_are_refused(alice: openai.OpenAI, extra: dict) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        alice.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body=extra)
    assert e.value.code == "unsupported_parameter"
    assert e.value.param == next(iter(extra))


@pytest.mark.parametrize("extra", [
    {"top_k": -3}, {"min_p": 2}, {"presence_penalty": 3}, {"frequency_penalty": -2.1},
    {"repetition_penalty": 0}, {"logit_bias": {"1": 200}}, {"n": 0}, {"logprobs": 9},
    {"stop_token_ids": [-1]},
])
def test_out_of_range_values_are_400_naming_the_parameter(alice: openai.OpenAI,
                                                          extra: dict) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        alice.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body=extra)
    assert e.value.code == "invalid_value" and e.value.param == next(iter(extra))


def test_unsupported_chat_parameters_are_refused(alice: openai.OpenAI) -> None:
    for extra in ({"prediction": {"type": "content", "content": "x"}},
                  {"functions": [{"name": "f"}]},
                  {"modalities": ["audio"]}):
        with pytest.raises(openai.BadRequestError) as e:
            alice.chat.completions.create(model=MODEL, max_tokens=1, extra_body=extra,
                                          messages=[{"role": "user", "content": "x"}])
        assert e.value.code == "unsupported_parameter"
    # Defaults and ignored parameters pass.
    r = alice.chat.completions.create(model=MODEL, max_tokens=1, n=1, user="u",
                                      messages=[{"role": "user", "content": "x"}],
                                      frequency_penalty=0, temperature=0)
    assert r.choices[0].message.role == "assistant"


def test_serve_refuses_bad_input_in_one_line(tiny_dir: Path, env: dict[str, str]) -> None:
    for args, message in (
        (["--listen", "nowhere"], "expected HOST:PORT"),
        (["--max-queue", "0"], "--max-queue must be >= 1"),
    ):
        with pytest.raises(RuntimeError) as e:
            ServeProcess(["--model", str(tiny_dir), *args], env)
        assert message in str(e.value)
