"""``kvstore demo``: bad counts are refused in one line (issue 14, item 12: ``--turns -1``
ran no turn and exited 0), and a small run prints its table."""

from __future__ import annotations

import pytest

from kvstore.cli import main


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--turns", "-1"], "--turns must be in [1, 10000], got -1"),
        (["--turns", "0"], "--turns must be in"),
        (["--sessions", "0"], "--sessions must be in [1, 1000], got 0"),
        (["--sessions", "1000000"], "--sessions must be in"),
    ],
)
def test_bad_counts_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["demo", "--no-ssd", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_small_run_reports_hits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-ssd", "--turns", "3", "--sessions", "2"]) == 0
    out = capsys.readouterr().out
    assert "hit" in out.lower()


@pytest.mark.parametrize("ssd", [["--no-ssd"], []])
def test_more_dram_than_the_machine_has_is_one_line(
    capsys: pytest.CaptureFixture[str], ssd: list[str]
) -> None:
    # Issue 36 (item 1): numpy's _ArrayMemoryError ended a 22-line traceback, exit 1.
    assert main(["demo", *ssd, "--dram", "1PiB", "--turns", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("kvstore demo: error: --dram 1024.0 TiB is more than this machine's")
