"""``kvengine bench-serve`` through a real ``kvengine serve`` (embedded store, tiny model):
a small generated kv-cache-tester trace, and a slice of the real ones when present. The
measured token hit rate must agree with the simulator's prediction on the same scaled
requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli import main
from engine.server.scaled_requests import block_tokens, load_sessions
from tests.conftest import traces_dir
from tests.engine.server.serve_process import ServeProcess

K = 4


def write_trace(directory: Path, sessions: int = 3, turns: int = 4) -> list[str]:
    """Agent-like sessions: a shared 19-block prefix, six new blocks per turn."""
    paths = []
    for s in range(sessions):
        reqs, ids, t = [], list(range(1, 20)), 0.0
        for turn in range(turns):
            reqs.append({"t": t, "type": "n", "in": len(ids) * 64 + 30, "out": 5,
                         "hash_ids": list(ids)})
            ids += list(range(100 * (turn + 1) + s, 100 * (turn + 1) + s + 6))
            t += 10.0
        p = directory / f"trace_{s}.json"
        p.write_text(json.dumps({"id": f"s{s}", "block_size": 64, "hash_id_scope": "local",
                                 "requests": reqs}))
        paths.append(str(p))
    return paths


@pytest.fixture(scope="module")
def server(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    store = tmp_path_factory.mktemp("store")
    env = {"KVENGINE_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", f"embedded:{store}",
                       "--block-tokens", str(K), "--pool-tokens", "256",
                       "--no-cache-generated", "--dram", "64MiB", "--ssd-capacity", "256MiB"],
                      env) as s:
        yield s


def write_mooncake(directory: Path) -> str:
    """Mooncake-style requests: three conversations of 512-token blocks whose ids chain the
    prefix (a turn repeats the previous turn's full blocks), each ending in a partial block."""
    lines, next_id = [], 1000
    chains: list[list[int]] = [[1, 2, 3], [1, 4], [5]]  # two share block 1 (a system prompt)
    for turn in range(3):
        for c, chain in enumerate(chains):
            full = list(chain)
            partial = next_id
            next_id += 1
            lines.append(json.dumps({"timestamp": 1000 * (3 * turn + c),
                                     "input_length": len(full) * 512 + 100,
                                     "output_length": 5, "hash_ids": [*full, partial]}))
            chain.extend([next_id, next_id + 1])  # the next turn adds two full blocks
            next_id += 2
    p = directory / "conversation.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def bench(server: ServeProcess, paths: list[str], capsys: pytest.CaptureFixture[str],
          *extra: str) -> dict:
    rc = main(["bench-serve", *paths, "--target", server.base_url,
               "--tokens-per-trace-block", str(K), "--dram", "64MiB", "--ssd", "256MiB",
               "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["errors"] == 0, out["first_errors"]
    return out


def test_equal_trace_ids_give_equal_tokens(tmp_path: Path) -> None:
    paths = write_trace(tmp_path, sessions=2)
    sessions = load_sessions(paths, K, vocab=512, low=16, n_sessions=None, per_session=None)
    first, second = sessions[0][0], sessions[0][1]
    # The second turn extends the first: same blocks, same tokens, then new ones.
    assert second.prompt[: len(first.keys) * K] == first.prompt[: len(first.keys) * K]
    # A session's ids are its own: session 1's block 1 differs from session 0's.
    assert sessions[1][0].prompt[:K] != first.prompt[:K]
    assert block_tokens(7, K, 16, 496) == block_tokens(7, K, 16, 496)
    assert all(16 <= t < 512 for r in sessions[0] for t in r.prompt)


def test_mooncake_requests_are_sessions_of_one_and_keep_only_full_blocks(
        tmp_path: Path) -> None:
    path = write_mooncake(tmp_path)
    sessions = load_sessions([path], K, vocab=512, low=16, n_sessions=None, per_session=None)
    assert [len(s) for s in sessions] == [1] * 9  # trace order, one request each
    first, shared, later = sessions[0][0], sessions[1][0], sessions[3][0]
    # Full blocks only (the partial last id is dropped), then ceil(100 * K / 512) = 1 token.
    assert first.keys == [1, 2, 3] and first.tail_tokens == 1
    assert len(first.prompt) == 3 * K + 1
    # Equal ids, equal tokens, across requests: block 1 is shared by two conversations,
    # and the next turn of conversation 0 starts with its blocks.
    assert shared.prompt[:K] == first.prompt[:K]
    assert shared.prompt[K : 2 * K] != first.prompt[K : 2 * K]
    assert later.prompt[: 3 * K] == first.prompt[: 3 * K]
    assert later.keys == [1, 2, 3, 1001, 1002]
    assert len(load_sessions([path], K, 512, 16, n_sessions=4, per_session=None)) == 4


def test_replay_of_a_mooncake_trace_hits_what_the_simulator_predicts(
        server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One in flight: each request sees every earlier one's blocks (in the pool: the fixture's
    # pool outlasts this trace), as the simulator does.
    out = bench(server, [write_mooncake(tmp_path)], capsys, "--concurrency", "1")
    assert out["requests"] == 9 and out["sessions"] == 9
    predicted = out["predicted"]["token_hit_rate"]
    assert predicted > 0.3
    assert abs(out["token_hit_rate"] - predicted) <= 0.01


def test_bench_serve_refuses_an_unknown_trace(
        server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    rc = main(["bench-serve", str(bad), "--target", server.base_url,
               "--tokens-per-trace-block", str(K)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err


def test_replay_of_a_small_trace_hits_what_the_simulator_predicts(
        server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bench(server, write_trace(tmp_path), capsys)
    assert out["requests"] == 12
    predicted = out["predicted"]["token_hit_rate"]
    assert predicted > 0.5
    assert abs(out["token_hit_rate"] - predicted) <= 0.01
    assert sum(out["hit_tokens"].values()) == out["cached_tokens"]
    assert out["hit_tokens"]["dram"] > 0  # the pool is too small for three sessions
    for q in ("p50", "p90", "p99"):
        assert out["ttft_s"][q] > 0
    assert set(out["ttft_parts_s"]) == {"queue", "store_lookup", "store_load", "compute"}


def test_bench_serve_refuses_a_mismatched_block_size(
        server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench-serve", *write_trace(tmp_path, 1, 1), "--target", server.base_url,
               "--tokens-per-trace-block", "8"])
    assert rc == 2 and "--block-tokens 8" in capsys.readouterr().err


def sample_traces() -> Path:
    root = traces_dir()
    if root is None:
        pytest.skip("sample traces not found: set KVSTORE_TRACES_DIR or provide ../shared/traces")
    return root


def embedded_server(tiny_dir: Path, store: Path, pool_tokens: int, *extra: str) -> ServeProcess:
    return ServeProcess(["--model", str(tiny_dir), "--kv-store", f"embedded:{store}",
                         "--block-tokens", str(K), "--pool-tokens", str(pool_tokens), *extra,
                         "--no-cache-generated", "--dram", "64MiB", "--ssd-capacity", "256MiB"],
                        {"KVENGINE_CACHE_DIR": str(store / "cache")})


@pytest.mark.traces
def test_replay_of_real_agent_sessions(tiny_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = sample_traces()
    paths = [str(root / "kv-cache-tester" / n) for n in ("trace_0048.json", "trace_0115.json")]
    # Two sessions of up to 1277 blocks: 4 tokens a block stays inside the 8 K context, and
    # the pool holds one prompt. One request admitted at a time: prompts longer than a step's
    # budget grow chunk by chunk, and two growing at once in this pool would preempt one,
    # whose re-admission then hits the blocks it computed itself (counted as pool hits; the
    # simulator has no such thing), a timing-dependent excess.
    with embedded_server(tiny_dir, tmp_path, 6144, "--max-num-seqs", "1") as server:
        out = bench(server, paths, capsys, "--requests-per-session", "5")
        # What to look at if it ever falls short again (once in four CI runs on
        # 2026-12-01, by 0.05, never reproduced): store calls that took over a second.
        slow = {call: server.metric("kvengine_store_call_seconds_count", f'call="{call}"')
                - server.metric("kvengine_store_call_seconds_bucket", f'call="{call}",le="1.0"')
                for call in ("lookup", "get", "commit")}
        tail = server.stderr_lines[-5:]
    assert out["requests"] == 10
    assert abs(out["token_hit_rate"] - out["predicted"]["token_hit_rate"]) <= 0.01, (
        f"by tier {out['hit_rate_by_tier']}, predicted {out['predicted']['hit_rate_by_tier']};"
        f" store calls over 1 s: {slow}; server stderr: {tail}")


@pytest.mark.traces
def test_replay_of_the_mooncake_sample(tiny_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    trace = sample_traces() / "mooncake" / "conversation_trace.jsonl"
    if not trace.is_file():
        pytest.skip(f"{trace} not found: the Mooncake sample trace is absent")
    # The first 40 requests (block 0 repeats: a shared system prompt), 4 tokens a 512-token
    # block, one in flight (so each sees every earlier request's blocks, as the simulator
    # does) and a pool that holds them all.
    with embedded_server(tiny_dir, tmp_path, 8192) as server:
        out = bench(server, [str(trace)], capsys, "--sessions", "40", "--concurrency", "1")
    assert out["requests"] == 40
    assert out["predicted"]["token_hit_rate"] > 0
    assert abs(out["token_hit_rate"] - out["predicted"]["token_hit_rate"]) <= 0.01
