"""``kvstore`` command line: every bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import pytest

from kvstore.cli import main


def run_bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own exit
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "argv, line",
    [
        # Issue 36 (item 8): argparse printed its 16-line usage block first.
        (
            ["serve", "--workers", "abc"],
            "kvstore serve: error: --workers: invalid int value: 'abc' (see kvstore serve --help)",
        ),
        (
            ["stats", "--nope"],
            "kvstore stats: error: unrecognized arguments: --nope (see kvstore stats --help)",
        ),
        (
            ["hitrate"],
            "kvstore hitrate: error: the following arguments are required: LOG"
            " (see kvstore hitrate --help)",
        ),
    ],
)
def test_argparse_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert run_bad(capsys, argv) == line
