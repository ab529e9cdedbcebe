"""``kvengine``: argparse's errors are one line, as every other error of the command."""

from __future__ import annotations

import os

import pytest

from engine.entrypoints import cli


def test_a_bad_flag_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 36 (item 8): argparse printed the whole usage block before its message.
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--model", "m", "--prompt-file", "p", "--max-new-tokens", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "kvengine generate: error: --max-new-tokens: invalid int value: 'x'"
        " (see kvengine generate --help)"
    ]


def test_grpc_core_logging_stays_off_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 36 (item 2): kvengine is only a gRPC client; C-core log lines are not its output.
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    with pytest.raises(SystemExit):
        cli.main(["generate", "--nope"])
    assert os.environ.get("GRPC_VERBOSITY") == "NONE"
