"""Bounded replay at the command line (issue 12): ``kvengine generate`` on the ``tiny
--hybrid`` checkpoint (replayed tokens and stored bytes per token per turn, the flags and
their refusals) and ``kvengine replay-fidelity``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bounded_replay import MEASURED_FIDELITY
from engine.entrypoints import cli
from engine.entrypoints.session import SessionTurn
from tests.engine.sessions import agent_session, write_session_file

# tiny: 2 layers (the sliding one first), 2 KV heads of 16, float32 K and V.
LAYER_BYTES_PER_TOKEN = 2 * 2 * 16 * 4
SAFE_KEEP = 128 + 12


@pytest.fixture(scope="module")
def session_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_session_file(tmp_path_factory.mktemp("sessions") / "agents.jsonl",
                              agent_session(turns_each=2))


@pytest.fixture(scope="module")
def other_session_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One turn sharing two thirds of ``session_file``'s header: a store hit that ends at
    none of the first session's committed ends (no window tail there)."""
    first = agent_session(turns_each=2)[0].user
    text = first[: len(first) * 2 // 3] + "\nTask for c: tidy up"
    return write_session_file(tmp_path_factory.mktemp("sessions") / "other.jsonl",
                              [SessionTurn("c", text)])


def main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def generate_json(capsys: pytest.CaptureFixture[str], model: Path, session: Path,
                  store: Path, *extra: str) -> list[dict]:  # type: ignore[type-arg]
    code, out, err = main(capsys, "generate", "--model", str(model), "--session-file",
                          str(session), "--kv-store", f"embedded:{store}", "--dram", "64MiB",
                          "--ssd-capacity", "256MiB", "--max-new-tokens", "5", "--json",
                          *extra)
    assert code == 0, err
    return list(json.loads(out)["turns"])


def test_a_second_process_replays_nothing_at_a_tail_and_keep_tokens_elsewhere(
    tiny_hybrid_dir: Path, session_file: Path, other_session_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "store"
    keep = ("--replay-keep", str(SAFE_KEEP))  # opted into: exact mode is the default
    first = generate_json(capsys, tiny_hybrid_dir, session_file, store, *keep)
    # One process: its pool hits hold every layer (computed here), nothing is replayed.
    assert all(t["replayed_tokens"] == 0 for t in first)
    assert sum(t["hit_tokens"]["hbm"] for t in first) > 0
    # The same first turn in a second process hits the store exactly at the end the first
    # committed, with its window tail: nothing replayed.
    second = generate_json(capsys, tiny_hybrid_dir, session_file, store, *keep)
    t0 = second[0]
    assert t0["hit_tokens"]["dram"] + t0["hit_tokens"]["ssd"] > SAFE_KEEP
    assert t0["replayed_tokens"] == 0
    # A turn sharing only the header hits elsewhere: no tail there, keep tokens replayed.
    (other,) = generate_json(capsys, tiny_hybrid_dir, other_session_file, store, *keep)
    assert other["hit_tokens"]["dram"] + other["hit_tokens"]["ssd"] > SAFE_KEEP
    assert other["replayed_tokens"] == SAFE_KEEP
    # The full layer of every token plus the sliding one of a window tail per committed
    # end (ceil(127 / 64) = 2 blocks), over the turn's context.
    for t in [*first, *second, other]:
        context = t["prompt_tokens"] + len(t["token_ids"])
        tail = min(2, context // 64) * 64
        assert t["stored_bytes_per_token"] == pytest.approx(
            LAYER_BYTES_PER_TOKEN * (1 + tail / context))
        hit = sum(t["hit_tokens"].values())
        assert hit + t["computed_tokens"] == t["prompt_tokens"] + t["replayed_tokens"]


@pytest.mark.parametrize("flags", [["--cache-all-layers"], []])
def test_cache_all_layers_is_exact_and_stores_every_layer(
    tiny_hybrid_dir: Path, session_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], flags: list[str],
) -> None:
    """--cache-all-layers, and no flag at all: exact mode is the default (the rule in
    bounded_replay/README.md)."""
    store = tmp_path / "store"
    generate_json(capsys, tiny_hybrid_dir, session_file, store, *flags)
    second = generate_json(capsys, tiny_hybrid_dir, session_file, store, *flags)
    assert second[0]["hit_tokens"]["dram"] + second[0]["hit_tokens"]["ssd"] > 0
    for t in second:
        assert t["replayed_tokens"] == 0
        assert t["stored_bytes_per_token"] == 2 * LAYER_BYTES_PER_TOKEN
        assert sum(t["hit_tokens"].values()) + t["computed_tokens"] == t["prompt_tokens"]


def test_a_forced_small_keep_replays_that_many(
    tiny_hybrid_dir: Path, session_file: Path, other_session_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "store"
    forced = ("--replay-keep", "40", "--force")
    generate_json(capsys, tiny_hybrid_dir, session_file, store, *forced)
    (other,) = generate_json(capsys, tiny_hybrid_dir, other_session_file, store, *forced)
    assert other["replayed_tokens"] == 40


def test_a_full_attention_model_ignores_keep(
    tiny_dir: Path, session_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "store"
    generate_json(capsys, tiny_dir, session_file, store, "--replay-keep", "5")
    second = generate_json(capsys, tiny_dir, session_file, store, "--replay-keep", "5")
    assert second[0]["hit_tokens"]["dram"] + second[0]["hit_tokens"]["ssd"] > 0
    assert all(t["replayed_tokens"] == 0 for t in second)
    assert all(t["stored_bytes_per_token"] == 2 * LAYER_BYTES_PER_TOKEN for t in second)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--replay-keep", "64"], "below the safe minimum of 140 tokens"),
        (["--replay-keep", "140", "--cache-all-layers"], "exclude each other"),
        (["--replay-keep", "-1"], "must be a token count >= 0"),
    ],
)
def test_unsafe_replay_flags_are_refused(
    tiny_hybrid_dir: Path, session_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str,
) -> None:
    store = tmp_path / "store"
    code, out, err = main(capsys, "generate", "--model", str(tiny_hybrid_dir), "--session-file",
                          str(session_file), "--kv-store", f"embedded:{store}", *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err
    assert not store.exists()  # refused before the store opened


def test_replay_fidelity_json(tiny_hybrid_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir),
                          "--keep", "0,40,default", "--lengths", "300", "--num-prompts", "1",
                          "--hits", "0.9", "--turns", "2", "--new-tokens", "4",
                          "--turn-tokens", "20", "--block-tokens", "16", "--force", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["keeps"] == [0, 40, SAFE_KEEP] and doc["safe_keep_tokens"] == SAFE_KEEP
    assert doc["dtype"] == "float32"
    runs = {(r["keep_tokens"], r["turn"]): r for r in doc["runs"]}
    assert len(runs) == 6 and len(doc["summary"]) == 6
    for turn in (1, 2):
        exact = runs[0, turn]
        assert exact["mode"] == "exact" and exact["replayed_tokens"] == 0
        assert exact["hit_tokens"] > 0 and exact["max_abs_logit_diff"] < 1e-4
        assert exact["greedy_agreement"] == 1.0
        assert runs[40, turn]["replayed_tokens"] == 40
        # tiny's sliding layer comes first: a keep over its window rebuilds it exactly.
        assert runs[SAFE_KEEP, turn]["max_abs_logit_diff"] < 1e-4
    # Turn 2 hits what turn 1 committed: more than the 90 % of the first prompt.
    assert runs[40, 2]["hit_tokens"] > runs[40, 1]["prompt_tokens"] - 16
    # Below the window the sliding layer misses context: the drift shows.
    assert runs[40, 1]["max_abs_logit_diff"] > 1e-5


def test_replay_fidelity_table_and_bad_keep(
    tiny_hybrid_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir), "--keep",
                        "0", "--lengths", "100", "--num-prompts", "1", "--hits", "0.5",
                        "--turns", "1", "--new-tokens", "2", "--block-tokens", "16")
    assert code == 0
    header = next(line for line in out.splitlines() if line.split()[:2] == ["keep", "mode"])
    assert "greedy" in header and "KL" in header
    code, _, err = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir), "--keep",
                        "abc")
    assert code == 2 and "--keep" in err and err.count("\n") == 1


def test_replay_fidelity_on_real_text_json(tiny_hybrid_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir),
                          "--contexts", "200,300", "--keep", "0,default", "--new-tokens", "4",
                          "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["contexts"] == [200, 300] and doc["keeps"] == [0, SAFE_KEEP]
    assert doc["new_tokens"] == 4 and doc["noise_chunk_tokens"] == 512
    runs = {(r["context_tokens"], r["run"]): r for r in doc["runs"]}
    assert set(runs) == {(c, run) for c in (200, 300)
                         for run in ("chunk", "batch", "keep 0", f"keep {SAFE_KEEP}")}
    for c in (200, 300):
        exact = runs[c, "keep 0"]
        assert exact["mode"] == "exact" and exact["replayed_tokens"] == 0
        assert exact["hit_tokens"] == (c - 1) // 64 * 64
        assert exact["kl_mean"] < 1e-9 and exact["top1_agreement"] == 1.0
        assert runs[c, f"keep {SAFE_KEEP}"]["replayed_tokens"] == SAFE_KEEP
        assert runs[c, "chunk"]["mode"] == "cold" and runs[c, "chunk"]["hit_tokens"] == 0
        assert all(runs[c, r]["positions"] == 4 for r in ("chunk", "batch"))
    rule = doc["rule"]
    assert rule["factor"] == 2.0 and rule["default_keep_tokens"] == SAFE_KEEP
    assert [c["context_tokens"] for c in rule["checks"]] == [200, 300]
    assert rule["verdict"]


def test_replay_fidelity_on_real_text_table(tiny_hybrid_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir),
                          "--contexts", "150", "--keep", "default", "--new-tokens", "2")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.split()[:2] == ["context", "run"])
    for col in ("KL mean", "KL p99", "top-1", "greedy len"):
        assert col in header
    assert "context 150:" in out and "chunk floor" in out


def test_replay_fidelity_results_file_resumes(tiny_hybrid_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "runs.jsonl"
    args = ("replay-fidelity", "--model", str(tiny_hybrid_dir), "--keep", "default",
            "--new-tokens", "2", "--out", str(out_file), "--json")
    code, out, err = main(capsys, *args, "--contexts", "150")
    assert code == 0, err
    first = out_file.read_text().splitlines()
    assert len(first) == 3  # chunk, batch, keep: one line each
    assert {json.loads(line)["run"]["run"] for line in first} == {
        "chunk", "batch", f"keep {SAFE_KEEP}"}
    code, again, err = main(capsys, *args, "--contexts", "150")
    assert code == 0, err
    assert out_file.read_text().splitlines() == first  # nothing measured twice
    assert json.loads(again)["runs"] == json.loads(out)["runs"]
    code, out, err = main(capsys, *args, "--contexts", "150,200")
    assert code == 0, err
    assert len(out_file.read_text().splitlines()) == 6  # only 200's runs are new
    doc = json.loads(out)
    assert [c["context_tokens"] for c in doc["rule"]["checks"]] == [150, 200]
    # another dtype is another measurement: the file's rows are not its own
    code, out, err = main(capsys, *args, "--contexts", "150", "--dtype", "bfloat16")
    assert code == 0, err
    assert len(out_file.read_text().splitlines()) == 9
    out_file.write_text("not json\n")
    code, out, err = main(capsys, *args, "--contexts", "150")
    assert code == 2 and out == "" and err.count("\n") == 1 and "line 1" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--contexts", "200", "--keep", "64"], "below the safe minimum of 140 tokens"),
        (["--keep", "64"], "below the safe minimum of 140 tokens"),
        (["--contexts", "9000"], "longer than"),
        (["--contexts", "abc"], "--contexts"),
    ],
)
def test_replay_fidelity_refusals(tiny_hybrid_dir: Path, capsys: pytest.CaptureFixture[str],
                                  extra: list[str], message: str) -> None:
    code, out, err = main(capsys, "replay-fidelity", "--model", str(tiny_hybrid_dir), *extra,
                          "--json")  # no progress bars: the error is all of stderr
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_replay_fidelity_refuses_a_keep_without_sliding_layers(
        tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = main(capsys, "replay-fidelity", "--model", str(tiny_dir), "--contexts",
                          "200", "--keep", "default,140", "--json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no sliding layers" in err


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_help_prints_the_measured_fidelity(command: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "opt into bounded replay" in out and "exact is the default" in out
    for m in MEASURED_FIDELITY:
        if m.dtype == "bfloat16":  # the rule's dtype: each keep's multiple of the floor
            assert f"keep {m.keep_tokens} at {m.context_tokens} tokens ({m.dtype})" in out
            assert f"{m.times_floor:.1f}x the floor" in out
        else:
            assert (f"keep {m.keep_tokens} at {m.context_tokens} in {m.dtype}: KL "
                    f"{m.kl_mean:.2g}") in out
