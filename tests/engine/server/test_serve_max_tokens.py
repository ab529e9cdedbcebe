"""Issue 33: a request without ``max_tokens`` on a pool smaller than the context is served
(admitted on its prompt, stopped where the pool ends), and ``--max-model-len`` caps the
context the server reports and enforces."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.server.conftest import MODEL, client, words
from tests.engine.server.serve_process import ServeProcess


def test_no_max_tokens_on_a_small_pool_is_served(tiny_dir: Path, env: dict[str, str]) -> None:
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", "none", "--block-tokens", "16",
                       "--pool-tokens", "256", "--max-model-len", "1024"], env) as server:
        api = client(server)
        (model,) = api.models.list().data
        assert model.max_model_len == 1024  # type: ignore[attr-defined]
        # The rest of the context (1024 - prompt) is more than the 256-token pool holds.
        r = api.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": words(12)}], temperature=0, extra_body={
            "ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
        assert r.usage is not None
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 256 + 1
        # An explicit max_tokens past the pool: not reserved either, the same stop.
        c = api.completions.create(model=MODEL, prompt=words(10), max_tokens=400,
                                   temperature=0, extra_body={"ignore_eos": True})
        assert c.choices[0].finish_reason == "length" and c.usage is not None
        assert c.usage.prompt_tokens + c.usage.completion_tokens == 256 + 1


def test_a_max_model_len_above_the_models_is_refused(tiny_dir: Path,
                                                     env: dict[str, str]) -> None:
    with pytest.raises(RuntimeError) as e:
        ServeProcess(["--model", str(tiny_dir), "--max-model-len", "8193"], env)
    assert "8193 exceeds the model's context of 8192 tokens" in str(e.value)
