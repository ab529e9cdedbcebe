"""Shared by the ``kvengine serve`` modules: two servers started once for the package (the
embedded store with two tenants, and a plain one: the tests compare counts before and
after, or use prompts and salts of their own), the official ``openai`` client
(max_retries=0), prompts, and what the engine is expected to serve from cache."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine.core.config import EngineConfig
from engine.model.tokenizer import Tokenizer
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


@pytest.fixture(scope="package")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("auth") / "tokens"
    f.write_text("".join(f"{tok} {tenant}\n" for tenant, tok in TOKENS.items()))
    return f


@pytest.fixture(scope="package")
def prefix_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deployment's prefix key: a server with two tenants needs one (keyed chain keys)."""
    f = tmp_path_factory.mktemp("prefix-key") / "prefix.key"
    f.write_text(bytes(range(32)).hex() + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture(scope="package")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"KVENGINE_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


@pytest.fixture(scope="package")
def server(tiny_dir: Path, token_file: Path, prefix_key_file: Path, env: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The embedded store behind a small pool, two tenants (keyed chain keys)."""
    store = tmp_path_factory.mktemp("store")
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", f"embedded:{store}",
                       "--auth-token-file", str(token_file),
                       "--prefix-key-file", str(prefix_key_file), "--pool-tokens", "4096",
                       "--dram", "64MiB", "--ssd-capacity", "256MiB"], env) as s:
        yield s


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
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


def wait_for(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


STORE_CALLS = ("lookup", "get", "commit")


def store_calls(server: ServeProcess) -> dict[str, int]:
    """The store calls ``server`` has made so far, by call, once none is in flight: a
    request's commit runs on the committer's thread after its response was sent, so the
    count is read only when no load or commit is pending (nothing else is running)."""
    assert wait_for(lambda: all(
        server.metric("kvengine_store_jobs_pending", f'job="{job}"') == 0
        for job in ("load", "commit"))), "store transfers still pending"
    return {c: int(server.metric("kvengine_store_call_seconds_count", f'call="{c}"'))
            for c in STORE_CALLS}
