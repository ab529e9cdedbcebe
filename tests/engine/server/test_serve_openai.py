"""``kvengine serve`` against the official ``openai`` client (max_retries=0), real servers
on loopback, the tiny model, temperature 0: completions and chat, streamed and not, usage
(cached tokens) in streams, tenants, errors, a full queue, disconnects, and a store daemon
killed under a running server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.model.tokenizer import Tokenizer
from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.server.serve_process import ServeProcess

MODEL = "tiny-qwen3"
WORDS = ("block", "chain", "tier", "pool", "token", "prefix", "store", "commit", "load",
         "engine", "cache", "agent", "tool", "output", "session", "replay")
TOKENS = {"alice": "a" * 24 + "-alice-token", "bob": "b" * 24 + "-bob-token"}


def words(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed * 7 + i * 5) % len(WORDS)] for i in range(n))


def client(server: ServeProcess, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("auth") / "tokens"
    f.write_text("".join(f"{tok} {tenant}\n" for tenant, tok in TOKENS.items()))
    return f


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"KVENGINE_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


@pytest.fixture(scope="module")
def server(tiny_dir: Path, token_file: Path, env: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The embedded store behind a small pool, two tenants."""
    store = tmp_path_factory.mktemp("store")
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", f"embedded:{store}",
                       "--auth-token-file", str(token_file), "--pool-tokens", "4096",
                       "--dram", "64MiB", "--ssd-capacity", "256MiB"], env) as s:
        yield s


@pytest.fixture(scope="module")
def plain(tiny_dir: Path, env: dict[str, str]) -> Iterator[ServeProcess]:
    """No store, no auth, a queue of one request."""
    with ServeProcess(["--model", str(tiny_dir), "--max-queue", "1"], env) as s:
        yield s


@pytest.fixture
def alice(server: ServeProcess) -> openai.OpenAI:
    return client(server, TOKENS["alice"])


@pytest.fixture
def bob(server: ServeProcess) -> openai.OpenAI:
    return client(server, TOKENS["bob"])


BLOCK = EngineConfig().block_tokens  # the servers here run the default block size


def cached(usage: object) -> int:
    return usage.prompt_tokens_details.cached_tokens  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> Tokenizer:
    """The server's tokenizer and chat template, read here."""
    return Tokenizer.from_dir(tiny_dir)


def prefix_hit(prompt: list[int], held: list[int]) -> int:
    """Tokens of ``prompt`` the engine serves from cache when ``held`` (tokens whose KV is
    in whole cached blocks) is all it has: their longest common prefix in whole blocks,
    short of the prompt's last token (computed for the logits of the first new token)."""
    common = next((i for i, (a, b) in enumerate(zip(prompt, held, strict=False))
                   if a != b),
                  min(len(prompt), len(held)))
    return min(common, len(held), len(prompt) - 1) // BLOCK * BLOCK


# -- completions and chat ---------------------------------------------------------------

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


# -- errors ---------------------------------------------------------------------------

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
    {"n": 2}, {"logprobs": 2}, {"echo": True}, {"best_of": 3}, {"presence_penalty": 0.5},
    {"logit_bias": {"1": 5}}, {"suffix": "z"}, {"made_up_parameter": 1},
])
def test_unsupported_parameters_are_refused(alice: openai.OpenAI, extra: dict) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        alice.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body=extra)
    assert e.value.code == "unsupported_parameter"
    assert e.value.param == next(iter(extra))


def test_unsupported_chat_parameters_are_refused(alice: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for extra in ({"tools": [tool]}, {"logprobs": True}, {"n": 3},
                  {"response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as e:
            alice.chat.completions.create(model=MODEL, max_tokens=1, extra_body=extra,
                                          messages=[{"role": "user", "content": "x"}])
        assert e.value.code == "unsupported_parameter"
    # Defaults and ignored parameters pass.
    r = alice.chat.completions.create(model=MODEL, max_tokens=1, n=1, user="u",
                                      messages=[{"role": "user", "content": "x"}],
                                      frequency_penalty=0, temperature=0)
    assert r.choices[0].message.role == "assistant"


# -- the queue, disconnects, a long request ---------------------------------------------

def long_stream(c: openai.OpenAI, **extra: object):  # type: ignore[no-untyped-def]
    return c.completions.create(model=MODEL, prompt=words(20, seed=9), max_tokens=6000,
                                temperature=0, stream=True,
                                extra_body={"ignore_eos": True, **extra})


def wait_for(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_full_queue_is_503_with_retry_after_and_a_disconnect_frees_it(
        plain: ServeProcess) -> None:
    c = client(plain)
    aborted = plain.metric("kvengine_requests_total", 'finish_reason="abort"')
    stream = long_stream(c)
    next(iter(stream))  # the request is in flight
    # /health answers while the engine works.
    assert httpx.get(plain.base_url + "/health", timeout=5).status_code == 200
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
    assert e.value.body["code"] == "server_overloaded"  # type: ignore[index]
    stream.close()  # the client goes away mid-stream
    assert wait_for(lambda: plain.metric("kvengine_requests_total",
                                         'finish_reason="abort"') == aborted + 1)
    assert plain.metric("kvengine_requests_running") == 0
    assert plain.metric("kvengine_pool_used_blocks") == 0
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=1)  # room again
    assert r.usage is not None and r.usage.completion_tokens == 1


def test_disconnect_of_an_unstreamed_request_frees_it(server: ServeProcess) -> None:
    aborted = server.metric("kvengine_requests_total", 'finish_reason="abort"')
    body = {"model": MODEL, "prompt": words(20), "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=1.0,
                   headers={"Authorization": f"Bearer {TOKENS['bob']}"})
    assert wait_for(lambda: server.metric("kvengine_requests_total",
                                          'finish_reason="abort"') == aborted + 1)
    assert wait_for(lambda: server.metric("kvengine_pool_used_blocks") == 0)


def test_metrics_count_tokens_by_source_and_latencies(server: ServeProcess,
                                                      alice: openai.OpenAI) -> None:
    # The module's server has served other tests: compare counts before and after.
    parts = ("queue", "store_lookup", "store_load", "compute")
    watched = [("kvengine_prompt_tokens_total", 'source="hbm"'),
               ("kvengine_prompt_tokens_total", 'source="computed"'),
               ("kvengine_time_to_first_token_seconds_count", ""),
               ("kvengine_time_per_output_token_seconds_count", ""),
               *[("kvengine_ttft_part_seconds_count", f'part="{p}"') for p in parts]]
    before = [server.metric(*w) for w in watched]
    prompt = words(100, seed=10)
    usages = []
    for _ in range(2):  # ignore_eos: 3 tokens each, so each request has a time per token
        r = alice.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True})
        assert r.usage is not None and r.usage.completion_tokens == 3
        usages.append(r.usage)
    # Observed on the engine thread before each response is sent: no waiting needed.
    delta = dict(zip(watched, (server.metric(*w) - b for w, b in zip(watched, before,
                                                                       strict=True)),
                     strict=True))
    n = usages[0].prompt_tokens
    hit = (n - 1) // 64 * 64  # the second request: the pool's full blocks of the first
    assert (cached(usages[0]), cached(usages[1]), usages[1].prompt_tokens) == (0, hit, n)
    assert delta[watched[0]] == hit
    assert delta[watched[1]] == n + (n - hit)
    assert all(delta[w] == 2 for w in watched[2:]), delta
    assert server.metric("kvengine_store_call_seconds_count", 'call="commit"') > 0
    assert server.metric("kvengine_pool_blocks") == 4096 // 64


# -- a store daemon behind the server, killed under it ---------------------------------

def test_daemon_dies_under_a_running_server(tiny_dir: Path, token_file: Path,
                                            env: dict[str, str], tmp_path: Path,
                                            tok: Tokenizer) -> None:
    store_tokens = tmp_path / "store-tokens"
    engine_token = "e" * 32
    store_tokens.write_text(f"{engine_token} engine-1/*\n")
    (tmp_path / "engine-token").write_text(engine_token + "\n")
    prompt = words(150, seed=11)
    with (DaemonProcess(["--dram", "64MiB", "--auth-token-file", str(store_tokens)]) as daemon,
          ServeProcess(["--model", str(tiny_dir), "--kv-store", daemon.url,
                        "--auth-token-file", str(token_file),
                        "--store-token-file", str(tmp_path / "engine-token"),
                        "--pool-tokens", "4096"], env) as srv):
        c = client(srv, TOKENS["alice"])

        def ask() -> tuple[str, int]:
            r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                     temperature=0)
            assert r.usage is not None
            return r.choices[0].text, cached(r.usage)

        text, hit = ask()
        assert hit == 0
        # The daemon took alice's blocks under the delegated tenant engine-1/alice: a
        # refused namespace would be warned about ("kv store grpc is failing").
        assert wait_for(lambda: srv.metric("kvengine_store_call_seconds_count",
                                           'call="commit"') >= 1)
        assert not any("kv store" in line for line in srv.stderr_lines), srv.stderr_lines
        daemon.kill()
        ids = tok.encode(prompt)
        for _ in range(3):
            again, hit = ask()
            assert again == text and hit == prefix_hit(ids, ids)  # the pool still serves it
        other = c.completions.create(model=MODEL, prompt=words(90, seed=12),
                                     max_tokens=4, temperature=0)
        assert other.usage is not None and cached(other.usage) == 0
        assert srv.proc.poll() is None


def test_serve_refuses_bad_input_in_one_line(tiny_dir: Path, env: dict[str, str]) -> None:
    for args, message in (
        (["--listen", "nowhere"], "expected HOST:PORT"),
        (["--max-queue", "0"], "--max-queue must be >= 1"),
    ):
        with pytest.raises(RuntimeError) as e:
            ServeProcess(["--model", str(tiny_dir), *args], env)
        assert message in str(e.value)


def test_cached_tokens_leave_out_what_bounded_replay_recomputes(
        tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> None:
    """A hybrid model (sliding layers) under bounded replay: the store keeps the full layers
    only, so a store hit's last ``keep`` tokens are recomputed and not reported as cached."""
    from engine.model.make_model import make_model

    hybrid = make_model("qwen3", "tiny", tmp_path_factory.mktemp("hy") / "tiny-hybrid",
                        hybrid=True).path
    store = tmp_path_factory.mktemp("hy-store")
    prompt = words(150, seed=13)
    got = []
    for _ in range(2):  # the second process starts with an empty pool: its hit is the store's
        with ServeProcess(["--model", str(hybrid), "--kv-store", f"embedded:{store}",
                           "--pool-tokens", "4096"], env) as s:
            r = client(s).completions.create(model="tiny-hybrid", prompt=prompt,
                                              max_tokens=2, temperature=0)
            assert r.usage is not None
            got.append((cached(r.usage), r.usage.prompt_tokens))
    (first, n), (second, _) = got
    assert first == 0
    hit = (n - 1) // 64 * 64  # every full block, short of the last token's
    keep = 128 + 12  # the tiny hybrid's window + 12: the safe default
    assert hit > keep and second == hit - keep
