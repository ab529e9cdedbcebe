"""``kvengine generate``: the JSON it prints, the table for humans, two processes sharing
an embedded store, and bad input as one line with exit status 2."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.config import EngineConfig
from engine.entrypoints import cli
from engine.entrypoints.session import Conversation
from engine.model.tokenizer import Tokenizer
from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.sessions import agent_session, write_session_file

BLOCK = EngineConfig().block_tokens  # the CLI's default
TURN_KEYS = {"prompt_tokens", "hit_tokens", "computed_tokens", "replayed_tokens",
             "stored_bytes_per_token", "ttft_s", "decode_tokens_per_s", "token_ids", "text"}


TURNS = agent_session(turns_each=2)


@pytest.fixture(scope="module")
def session_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_session_file(tmp_path_factory.mktemp("sessions") / "agents.jsonl", TURNS)


def first_prompts(tiny_dir: Path) -> tuple[list[int], list[int]]:
    """The two agents' first prompts (the session's turns 0 and 1), as the CLI renders
    them: they depend on no answer."""
    tok = Tokenizer.from_dir(tiny_dir)
    return (Conversation(tok).next_prompt(TURNS[0].user),
            Conversation(tok).next_prompt(TURNS[1].user))


def whole_blocks_short_of_last(n: int) -> int:
    return (n - 1) // BLOCK * BLOCK


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_exactly_the_documented_shape(
    tiny_dir: Path, session_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = generate(capsys, "--model", str(tiny_dir), "--session-file",
                            str(session_file), "--max-new-tokens", "5", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"namespace", "turns"} and len(bytes.fromhex(doc["namespace"])) == 16
    assert len(doc["turns"]) == 4
    for turn in doc["turns"]:
        assert set(turn) == TURN_KEYS
        assert set(turn["hit_tokens"]) == {"hbm", "dram", "ssd"}
        assert len(turn["token_ids"]) == 5 and isinstance(turn["text"], str)
        assert sum(turn["hit_tokens"].values()) + turn["computed_tokens"] == turn["prompt_tokens"]
    # The second agent's first turn shares the header the first agent computed, which the
    # pool still holds: their common prefix, in whole blocks.
    a, b = first_prompts(tiny_dir)
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert doc["turns"][1]["hit_tokens"] == {
        "hbm": min(common, len(b) - 1) // BLOCK * BLOCK, "dram": 0, "ssd": 0}
    assert doc["turns"][1]["hit_tokens"]["hbm"] >= BLOCK
    # Each conversation's next turn extends its previous prompt and answer.
    assert doc["turns"][2]["prompt_tokens"] > doc["turns"][0]["prompt_tokens"] + 5


def test_table_for_humans(tiny_dir: Path, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("one plain prompt, no chat template")
    code, out, _ = generate(capsys, "--model", str(tiny_dir), "--prompt-file", str(prompt),
                            "--max-new-tokens", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["turn", "session", "prompt"]
    assert lines[1].split()[0] == "1" and "namespace" in out


def test_answers_under_their_rows(tiny_dir: Path, session_file: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = generate(capsys, "--model", str(tiny_dir), "--session-file",
                            str(session_file), "--max-new-tokens", "4", "--show-answers",
                            "--kv-store", "none")
    assert code == 0
    code, js, _ = generate(capsys, "--model", str(tiny_dir), "--session-file",
                           str(session_file), "--max-new-tokens", "4", "--json",
                           "--kv-store", "none")
    texts = [" ".join(t["text"].split()) for t in json.loads(js)["turns"]]
    lines = out.splitlines()
    rows = [i for i, ln in enumerate(lines) if ln.split() and ln.split()[0].isdigit()]
    assert len(rows) == len(TURNS) == len(texts)
    for i, text in zip(rows, texts, strict=True):
        assert lines[i + 1] == f"     > {text}"[: 7 + 160]


def test_sampling_is_reproducible_by_seed(tiny_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("sample from here")

    def tokens(seed: str) -> list[int]:
        code, out, _ = generate(capsys, "--model", str(tiny_dir), "--prompt-file", str(prompt),
                                "--max-new-tokens", "12", "--temperature", "1.5", "--top-p",
                                "0.9", "--seed", seed, "--json")
        assert code == 0
        return list(json.loads(out)["turns"][0]["token_ids"])

    assert tokens("3") == tokens("3")
    assert tokens("3") != tokens("4")


def test_two_processes_share_the_embedded_store(
    tiny_dir: Path, session_file: Path, tmp_path: Path
) -> None:
    """The second process starts with an empty DRAM tier: its hits come from the SSD."""
    cmd = [sys.executable, "-m", "engine.cli", "generate", "--model", str(tiny_dir),
           "--session-file", str(session_file), "--kv-store", f"embedded:{tmp_path / 'store'}",
           "--dram", "64MiB", "--ssd-capacity", "256MiB", "--max-new-tokens", "5", "--json"]
    runs = []
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout))
    first, second = runs
    assert first["namespace"] == second["namespace"]
    assert first["turns"][0]["computed_tokens"] == first["turns"][0]["prompt_tokens"]
    # The first process committed every whole block before it exited; the second starts
    # with an empty pool and DRAM tier. Both agents' first prompts (fixed by the session
    # file) are served whole, short of the last token, the first from the SSD.
    for i, prompt in enumerate(first_prompts(tiny_dir)):
        turn = second["turns"][i]
        assert turn["prompt_tokens"] == len(prompt)
        hit = whole_blocks_short_of_last(len(prompt))
        assert sum(turn["hit_tokens"].values()) == hit > 0
        assert turn["computed_tokens"] == len(prompt) - hit
    assert second["turns"][0]["hit_tokens"] == {
        "hbm": 0, "dram": 0, "ssd": whole_blocks_short_of_last(len(first_prompts(tiny_dir)[0]))}
    assert sum(t["computed_tokens"] for t in second["turns"]) < sum(
        t["computed_tokens"] for t in first["turns"]
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kv-store", "redis://x"], "expected none, embedded[:DIR] or grpc://HOST:PORT"),
        (["--greedy", "--temperature", "0.5"], "exclude each other"),
        (["--pool-tokens", "128"], "--pool-tokens"),
        (["--dram", "lots"], "lots"),
        (["--max-model-len", "8193"], "8193 exceeds the model's context of 8192 tokens"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    tiny_dir: Path, session_file: Path, capsys: pytest.CaptureFixture[str],
    extra: list[str], message: str,
) -> None:
    code, _, err = generate(capsys, "--model", str(tiny_dir), "--session-file",
                            str(session_file), *extra)
    assert code == 2
    assert err.count("\n") == 1 and message in err


def test_prompt_longer_than_the_context_is_a_clear_error(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = tmp_path / "long.txt"
    prompt.write_text("agent tool block chain " * 3000)
    code, _, err = generate(capsys, "--model", str(tiny_dir), "--prompt-file", str(prompt),
                            "--pool-tokens", "65536")
    assert code == 2 and "exceeds the model's context of 8192 tokens" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"user": "hi"}\nnot json\n', ":2: not JSON"),
        ('{"text": "hi"}\n', ':1: expected {"user": "..."}'),
        ('{"user": "hi", "role": "x"}\n', "unknown keys"),
        ("\n", "holds no turns"),
    ],
)
def test_bad_session_files_name_the_line(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
    message: str,
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    code, _, err = generate(capsys, "--model", str(tiny_dir), "--session-file", str(path))
    assert code == 2 and message in err


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", "generate", *args]


def _store_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "kv store" in line]


def test_an_unreachable_store_is_one_warning_and_a_count(tiny_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prompt = tmp_path / "p.txt"
    prompt.write_text("agent tool block chain " * 40)
    proc = subprocess.run(_cli("--model", str(tiny_dir), "--prompt-file", str(prompt),
                               "--kv-store", f"grpc://127.0.0.1:{port}", "--max-new-tokens",
                               "3", "--json"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (turn,) = json.loads(proc.stdout)["turns"]
    assert turn["computed_tokens"] == turn["prompt_tokens"] and len(turn["token_ids"]) == 3
    warning, count = _store_lines(proc.stderr)
    assert warning.startswith("kvengine: warning: kv store grpc is unreachable")
    assert count.startswith("kvengine: kv store grpc: ") and "failed" in count


def test_a_store_killed_mid_run_is_warned_once_and_counted(
    tiny_dir: Path, session_file: Path
) -> None:
    """``kill -9`` of the ``kvstore serve`` process after the first turn's row: the run
    goes on from the pool alone, says so once, and counts the failed calls."""
    with DaemonProcess(["--dram", "64MiB"]) as daemon:
        proc = subprocess.Popen(_cli("--model", str(tiny_dir), "--session-file",
                                     str(session_file), "--kv-store", daemon.url,
                                     "--max-new-tokens", "5"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            head = [proc.stdout.readline(), proc.stdout.readline()]  # header, turn 1
            daemon.kill()
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    rows = [line.split() for line in (head + out.splitlines())[1:5]]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert all(r[4] == r[5] == "0" for r in rows[1:])  # no dram/ssd hits once it is dead
    assert int(rows[1][3]) > 0  # the pool still serves the shared header
    warning, count = _store_lines(err)
    assert warning.startswith("kvengine: warning: kv store grpc is unreachable")
    failed = int(count.split(": ")[2].split()[0])
    assert count.endswith("failed; their blocks were served as misses") and failed >= 1


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    parser = cli.build_parser("generate")
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = [a for a in sub.choices["generate"]._actions if a.option_strings]
    assert len(flags) >= 18
    for action in flags:
        assert action.help and len(action.help) >= 15, action.option_strings
        assert action.option_strings[-1] in text
    for word in ("none", "embedded", "grpc://", "session", "hit", "exit status 2"):
        assert word in text


@pytest.mark.slow
def test_compile_gives_the_same_answers(tiny_dir: Path, session_file: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--compile`` end to end (a multi-turn session: prefill chunks, pool hits, decode):
    the same greedy tokens as eager (engine.model.compiled; ~1 min cold on a loaded VM)."""
    answers = []
    for flag in ("--no-compile", "--compile"):
        code, out, err = generate(capsys, "--model", str(tiny_dir), "--session-file",
                                  str(session_file), "--max-new-tokens", "5", "--json", flag)
        assert code == 0 and "running eager" not in err, err
        answers.append([t["token_ids"] for t in json.loads(out)["turns"]])
    assert answers[0] == answers[1]
