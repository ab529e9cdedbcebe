"""``kvengine serve`` with a store behind it: a daemon killed under a running server (the
pool keeps serving), and cached tokens under bounded replay (a hybrid model's store hit
less the tokens it recomputes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.tokenizer import Tokenizer
from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.server.conftest import (
    MODEL,
    TOKENS,
    cached,
    client,
    prefix_hit,
    store_calls,
    words,
)
from tests.engine.server.serve_process import ServeProcess


def test_daemon_dies_under_a_running_server(tiny_dir: Path, token_file: Path,
                                            prefix_key_file: Path,
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
                        "--prefix-key-file", str(prefix_key_file),
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
        # refused namespace would be warned about ("kv store grpc is failing"). The one
        # request asked the store once (a miss: no get) and committed once, after its
        # response: store_calls waits for that commit.
        assert store_calls(srv) == {"lookup": 1, "get": 0, "commit": 1}
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


def test_cached_tokens_leave_out_what_bounded_replay_recomputes(
        tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> None:
    """A hybrid model (sliding layers) under bounded replay: the store keeps the full layers
    and, at each committed end, the window tail. The same prompt in a second process hits
    its first's committed end: the tail is there, nothing is replayed. A prompt sharing
    only its beginning hits elsewhere: its last ``keep`` tokens are recomputed and not
    reported as cached."""
    from engine.model.make_model import make_model

    hybrid = make_model("qwen3", "tiny", tmp_path_factory.mktemp("hy") / "tiny-hybrid",
                        hybrid=True).path
    store = tmp_path_factory.mktemp("hy-store")
    prompt = words(150, seed=13)
    other = " ".join(prompt.split()[:100] + words(40, seed=14).split())
    keep = 128 + 12  # the tiny hybrid's window + 12: the safe default
    got = []
    # The second process starts with an empty pool: its hits are the store's.
    for prompts in ([prompt], [prompt, other]):
        with ServeProcess(["--model", str(hybrid), "--kv-store", f"embedded:{store}",
                           "--pool-tokens", "4096", "--replay-keep", str(keep)], env) as s:
            for text in prompts:
                r = client(s).completions.create(model="tiny-hybrid", prompt=text,
                                                  max_tokens=2, temperature=0)
                assert r.usage is not None
                got.append((cached(r.usage), replayed(r.usage), r.usage.prompt_tokens))
    (first, first_replayed, n), (again, again_replayed, _), (elsewhere, replayed_there, _) = got
    assert first == first_replayed == 0
    hit = (n - 1) // 64 * 64  # every full block, short of the last token's
    assert hit > keep and again == hit and again_replayed == 0  # the first's committed end
    # Which mode served it, per response: bounded replay recomputed `keep` tokens.
    assert replayed_there == keep and elsewhere > 0


def replayed(usage: object) -> int:
    return usage.prompt_tokens_details.replayed_tokens  # type: ignore[attr-defined]
